// test/frame_scanner.hpp — finds frame boundaries in bytes a transport
// writes (tests only). Test decorators that act "at frame N" (a connection
// that dies before its N-th frame, before a delivery ack) follow the frames
// through writes of any size, as the sender combines many into one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>

#include "blobpipe/protocol/wire.hpp"

namespace blobpipe::testing {

class frame_scanner {
 public:
  /// Called for each frame header, in order, with the frame's number
  /// (0-based); returning true stops the stream before that frame.
  using stop_fn = std::function<bool(const frame_header& h, std::uint64_t number)>;
  explicit frame_scanner(stop_fn stop) : stop_(std::move(stop)) {}

  /// Walks `bytes` (the next bytes of the stream). Returns how many of them
  /// go out before the frame `stop` picked, or nullopt when all do. A
  /// header split across calls stops the stream where its last part
  /// begins.
  std::optional<std::size_t> feed(std::span<const std::byte> bytes) {
    std::size_t at = 0;
    while (at < bytes.size()) {
      if (payload_left_ != 0) {
        const std::size_t n = std::min<std::uint64_t>(payload_left_, bytes.size() - at);
        payload_left_ -= n;
        at += n;
        continue;
      }
      const std::size_t start = at;
      const bool begins_here = have_ == 0;
      const std::size_t n = std::min(frame_header_size - have_, bytes.size() - at);
      std::memcpy(header_.data() + have_, bytes.data() + at, n);
      have_ += n;
      at += n;
      if (have_ < frame_header_size) break;
      have_ = 0;
      auto h = decode_frame_header(header_, ~std::uint32_t{0});
      if (!h) return std::nullopt;  // not frames: nothing to act on
      if (stop_(*h, frames_++)) return begins_here ? start : 0;
      payload_left_ = h->length;
    }
    return std::nullopt;
  }

 private:
  stop_fn stop_;
  std::array<std::byte, frame_header_size> header_{};
  std::size_t have_ = 0;
  std::uint64_t payload_left_ = 0;
  std::uint64_t frames_ = 0;
};

}  // namespace blobpipe::testing
