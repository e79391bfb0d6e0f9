// The frame codec (docs/wire.md "Frame header", "Handshake", "entry_begin").
#include "blobpipe/protocol/wire.hpp"

#include <cstring>

#include "lib/format/le.hpp"

namespace blobpipe {

using detail::load_le;
using detail::store_le;

const char* frame_type_name(frame_type t) noexcept {
  switch (t) {
    case frame_type::hello: return "hello";
    case frame_type::blob_begin: return "blob_begin";
    case frame_type::entry_begin: return "entry_begin";
    case frame_type::data: return "data";
    case frame_type::tail: return "tail";
    case frame_type::blob_abort: return "blob_abort";
    case frame_type::ack: return "ack";
    case frame_type::close: return "close";
  }
  return "unknown";
}

void encode_frame_header(const frame_header& h, std::span<std::byte> out) noexcept {
  std::byte* p = out.data();
  store_le<std::uint8_t>(p + 0, static_cast<std::uint8_t>(h.type));
  store_le<std::uint8_t>(p + 1, 0);
  store_le<std::uint16_t>(p + 2, 0);
  store_le<std::uint32_t>(p + 4, h.length);
  store_le<std::uint64_t>(p + 8, h.blob_id);
  store_le<std::uint64_t>(p + 16, h.arg);
}

result<frame_header> decode_frame_header(std::span<const std::byte> in,
                                         std::uint32_t max_frame_bytes) {
  if (in.size() < frame_header_size)
    return {errc::too_small, "frame header: " + std::to_string(in.size()) + " bytes, need 24"};
  const std::byte* p = in.data();
  const auto type = load_le<std::uint8_t>(p + 0);
  if (!is_known_frame_type(type))
    return {errc::protocol_violation, "frame header: unknown frame type " + std::to_string(type)};
  if (load_le<std::uint8_t>(p + 1) != 0 || load_le<std::uint16_t>(p + 2) != 0)
    return {errc::protocol_violation, "frame header: non-zero flags/reserved"};
  frame_header h;
  h.type = static_cast<frame_type>(type);
  h.length = load_le<std::uint32_t>(p + 4);
  h.blob_id = load_le<std::uint64_t>(p + 8);
  h.arg = load_le<std::uint64_t>(p + 16);
  if (h.length > max_frame_bytes)
    return {errc::protocol_violation, std::string("frame header: ") + frame_type_name(h.type) +
                                          " length " + std::to_string(h.length) +
                                          " exceeds max_frame_bytes " +
                                          std::to_string(max_frame_bytes)};
  return h;
}

std::vector<std::byte> encode_hello(const hello& h) {
  std::vector<std::byte> out(hello_size);
  std::byte* p = out.data();
  store_le<std::uint32_t>(p + 0, WIRE_MAGIC);
  store_le<std::uint16_t>(p + 4, h.version);
  store_le<std::uint16_t>(p + 6, static_cast<std::uint16_t>(h.role));
  store_le<std::uint32_t>(p + 8, h.max_chunk_bytes);
  store_le<std::uint32_t>(p + 12, h.max_key_bytes);
  store_le<std::uint64_t>(p + 16, h.window_bytes);
  store_le<std::uint32_t>(p + 24, h.max_meta_bytes);
  store_le<std::uint32_t>(p + 28, h.dedup_window);
  std::memcpy(p + 32, h.session.data(), h.session.size());
  return out;
}

result<hello> decode_hello(std::span<const std::byte> payload) {
  // Magic and version come before the size check: a version-1 peer (whose
  // hello is 32 bytes) is then told so by name, not by a size mismatch.
  if (payload.size() < 8)
    return {errc::protocol_violation,
            "hello: " + std::to_string(payload.size()) + " bytes, expected 48"};
  const std::byte* p = payload.data();
  if (load_le<std::uint32_t>(p) != WIRE_MAGIC)
    return {errc::protocol_violation, "hello: bad magic (not a blobpipe peer)"};
  hello h;
  h.version = load_le<std::uint16_t>(p + 4);
  if (h.version != WIRE_VERSION)
    return {errc::protocol_violation, "hello: unsupported wire version " +
                                          std::to_string(h.version) + " (this side speaks " +
                                          std::to_string(WIRE_VERSION) + ")"};
  if (payload.size() != hello_size)
    return {errc::protocol_violation,
            "hello: " + std::to_string(payload.size()) + " bytes, expected 48"};
  const auto role = load_le<std::uint16_t>(p + 6);
  if (role != static_cast<std::uint16_t>(wire_role::sender) &&
      role != static_cast<std::uint16_t>(wire_role::consumer))
    return {errc::protocol_violation, "hello: unknown role " + std::to_string(role)};
  h.role = static_cast<wire_role>(role);
  h.max_chunk_bytes = load_le<std::uint32_t>(p + 8);
  h.max_key_bytes = load_le<std::uint32_t>(p + 12);
  h.window_bytes = load_le<std::uint64_t>(p + 16);
  h.max_meta_bytes = load_le<std::uint32_t>(p + 24);
  h.dedup_window = load_le<std::uint32_t>(p + 28);
  std::memcpy(h.session.data(), p + 32, h.session.size());
  if (h.max_chunk_bytes < min_chunk_bytes)
    return {errc::protocol_violation,
            "hello: max_chunk_bytes " + std::to_string(h.max_chunk_bytes) + " below 64"};
  return h;
}

std::vector<std::byte> encode_entry_begin(std::string_view key,
                                          std::span<const std::byte> meta) {
  std::vector<std::byte> out(4 + key.size() + meta.size());
  store_le<std::uint32_t>(out.data(), static_cast<std::uint32_t>(key.size()));
  if (!key.empty()) std::memcpy(out.data() + 4, key.data(), key.size());
  if (!meta.empty()) std::memcpy(out.data() + 4 + key.size(), meta.data(), meta.size());
  return out;
}

result<entry_begin_view> decode_entry_begin(std::span<const std::byte> payload,
                                            std::uint32_t max_key_bytes,
                                            std::uint32_t max_meta_bytes) {
  if (payload.size() < 4)
    return {errc::protocol_violation, "entry_begin: payload shorter than its key length"};
  const std::uint64_t key_len = load_le<std::uint32_t>(payload.data());
  if (key_len > max_key_bytes)
    return {errc::protocol_violation, "entry_begin: key length " + std::to_string(key_len) +
                                          " exceeds max_key_bytes " +
                                          std::to_string(max_key_bytes)};
  // key_len <= 2^32 - 1, so 4 + key_len cannot overflow 64 bits.
  if (4 + key_len > payload.size())
    return {errc::protocol_violation, "entry_begin: key runs past the payload"};
  const std::size_t meta_len = payload.size() - 4 - key_len;
  if (meta_len == 0 || meta_len > max_meta_bytes)
    return {errc::protocol_violation, "entry_begin: meta size " + std::to_string(meta_len) +
                                          " not in [1, " + std::to_string(max_meta_bytes) + "]"};
  entry_begin_view v;
  v.key = std::string_view(reinterpret_cast<const char*>(payload.data() + 4), key_len);
  v.meta = payload.subspan(4 + key_len);
  return v;
}

}  // namespace blobpipe
