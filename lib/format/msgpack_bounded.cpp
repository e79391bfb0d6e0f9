#include "msgpack_bounded.hpp"

#include <exception>

namespace blobpipe::detail {

result<msgpack::object_handle> unpack_bounded(std::span<const std::byte> bytes,
                                              std::size_t max_depth,
                                              std::string_view what) {
  // Every element of an array or map takes at least one byte, and every str
  // or bin byte is present in the input, so the input length bounds them all.
  const std::size_t cap = bytes.size();
  const msgpack::unpack_limit limit(cap, cap, cap, cap, cap, max_depth);
  std::size_t off = 0;
  try {
    msgpack::object_handle oh =
        msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size(), off,
                        nullptr, nullptr, limit);
    if (off != bytes.size())
      return make_error(errc::malformed_index,
                        std::string(what) + ": " + std::to_string(bytes.size() - off) +
                            " trailing bytes after the msgpack object");
    return oh;
  } catch (const msgpack::insufficient_bytes&) {
    return make_error(errc::malformed_index, std::string(what) + ": truncated msgpack");
  } catch (const std::exception& e) {
    return make_error(errc::malformed_index,
                      std::string(what) + ": not valid msgpack (" + e.what() + ")");
  }
}

std::optional<std::uint64_t> as_uint(const msgpack::object& o) noexcept {
  if (o.type != msgpack::type::POSITIVE_INTEGER) return std::nullopt;
  return o.via.u64;
}

std::optional<std::string_view> as_str(const msgpack::object& o) noexcept {
  if (o.type != msgpack::type::STR) return std::nullopt;
  return std::string_view(o.via.str.ptr, o.via.str.size);
}

}  // namespace blobpipe::detail
