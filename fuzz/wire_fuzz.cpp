// libFuzzer entry point: the frame codec over arbitrary bytes —
// decode_frame_header (with a max_frame_bytes taken from the input),
// decode_hello (extensions included) and decode_entry_begin (with and
// without inline bytes). Whatever decodes must encode back to the same
// bytes (bazel build --config=fuzz).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "blobpipe/protocol/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = std::as_bytes(std::span(data, size));

  std::uint32_t max_frame = blobpipe::default_max_frame_bytes;
  if (size >= blobpipe::frame_header_size + 4)
    std::memcpy(&max_frame, data + blobpipe::frame_header_size, 4);
  if (auto h = blobpipe::decode_frame_header(in, max_frame)) {
    if (h->length > max_frame || !blobpipe::is_known_frame_type(static_cast<std::uint8_t>(h->type)))
      __builtin_trap();
    std::array<std::byte, blobpipe::frame_header_size> out;
    blobpipe::encode_frame_header(*h, out);
    if (std::memcmp(out.data(), data, out.size()) != 0) __builtin_trap();
  }

  if (auto hello = blobpipe::decode_hello(in)) {
    const auto out = blobpipe::encode_hello(*hello);
    if (out.size() != size || std::memcmp(out.data(), data, size) != 0) __builtin_trap();
  }

  for (bool with_inline : {false, true}) {
    for (std::uint32_t max_key : {0u, 16u, 1u << 16}) {
      auto eb = blobpipe::decode_entry_begin(in, with_inline, max_key, 256);
      if (!eb) continue;
      if (eb->key.size() > max_key || eb->meta.empty() || eb->meta.size() > 256) __builtin_trap();
      if (!with_inline && !eb->inline_bytes.empty()) __builtin_trap();
      const auto out = blobpipe::encode_entry_begin(eb->key, eb->meta, eb->inline_bytes);
      if (out.size() != size || std::memcmp(out.data(), data, size) != 0) __builtin_trap();
    }
  }
  return 0;
}
