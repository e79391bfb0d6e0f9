// test/frame_io.hpp — raw frames over a byte transport (tests only): write
// one frame, read the next one whole. Tests that play a hostile or scripted
// peer speak the wire protocol by hand with these; the library's own ends
// use the framer and the push decoder.
#pragma once

#include <array>
#include <cstring>
#include <span>
#include <system_error>
#include <tuple>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>

#include "blobpipe/protocol/wire.hpp"
#include "blobpipe/transport/transport.hpp"

namespace blobpipe::testing {

/// Writes one frame: `h` (its length set to the payload's size) and `payload`.
inline asio::awaitable<std::error_code> send_frame(transport& t, frame_header h,
                                                   std::span<const std::byte> payload = {}) {
  h.length = static_cast<std::uint32_t>(payload.size());
  std::array<std::byte, frame_header_size> head;
  encode_frame_header(h, head);
  std::array<asio::const_buffer, 2> bufs{asio::buffer(head), asio::buffer(payload.data(), payload.size())};
  co_return co_await t.write(std::span(bufs.data(), payload.empty() ? 1 : 2));
}

/// Reads whole frames from a transport, whatever its reads deliver.
class frame_reader {
 public:
  struct frame {
    frame_header header;
    std::vector<std::byte> payload;
  };

  /// The next frame. Errors: the transport's; protocol_violation for a
  /// header decode_frame_header refuses.
  asio::awaitable<std::tuple<std::error_code, frame>> next(transport& t) {
    frame f;
    std::array<std::byte, frame_header_size> head;
    if (auto ec = co_await take(t, head)) co_return std::tuple{ec, f};
    auto h = decode_frame_header(head, ~std::uint32_t{0});
    if (!h) co_return std::tuple{h.code(), f};
    f.header = *h;
    f.payload.resize(h->length);
    if (h->length != 0) {
      if (auto ec = co_await take(t, f.payload)) co_return std::tuple{ec, f};
    }
    co_return std::tuple{std::error_code{}, f};
  }

 private:
  asio::awaitable<std::error_code> take(transport& t, std::span<std::byte> out) {
    std::size_t done = 0;
    while (done < out.size()) {
      if (have_ == used_) {
        if (bulk_ != 0) {  // a message transport's bulk payload: exactly this read
          const std::size_t n = bulk_;
          bulk_ = 0;
          if (n != out.size() - done) co_return make_error_code(errc::protocol_violation);
          const std::error_code ec = co_await t.read_exact(out.subspan(done));
          co_return ec;
        }
        auto [ec, got] = co_await t.read_some(buf_);
        if (ec) co_return ec;
        have_ = got.bytes;
        used_ = 0;
        bulk_ = got.bulk_bytes;
      }
      const std::size_t n = std::min(out.size() - done, have_ - used_);
      std::memcpy(out.data() + done, buf_.data() + used_, n);
      used_ += n;
      done += n;
    }
    co_return std::error_code{};
  }

  std::array<std::byte, 64 << 10> buf_{};
  std::size_t have_ = 0, used_ = 0;
  std::size_t bulk_ = 0;
};

}  // namespace blobpipe::testing
