// fuzz/stream_input.hpp — the wire stream the stream fuzzers feed: the
// input's bytes, after a valid hello frame when the harness asks for one
// (so that most inputs get past the handshake).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "blobpipe/protocol/framer.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace blobpipe::fuzzing {

/// `h` framed as the stream's first frame (frame_hello), if given, then
/// `rest` as it is.
inline std::vector<std::byte> stream_input(const std::optional<hello>& h,
                                           std::span<const std::uint8_t> rest) {
  std::vector<std::byte> stream;
  if (h) {
    outbox o;
    frame_hello(o, *h);
    for (const auto& p : o.pieces()) {
      const auto b = p.bytes(o);
      stream.insert(stream.end(), b.begin(), b.end());
    }
  }
  const auto r = std::as_bytes(rest);
  stream.insert(stream.end(), r.begin(), r.end());
  return stream;
}

}  // namespace blobpipe::fuzzing
