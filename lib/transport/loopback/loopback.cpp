// In-process transport pair (docs/wire.md "Transport"). A send parks its
// frame in the peer's queue and waits until the receiver has copied the
// payload into its destination: one copy, no staging buffer.
#include "blobpipe/transport/loopback.hpp"

#include <algorithm>
#include <array>
#include <deque>

#include <asio/buffer.hpp>

#include "lib/transport/async_sync.hpp"

namespace blobpipe::loopback {
namespace {

// A frame owned by the sending coroutine's frame; the queue only points at it.
struct pending_frame {
  std::array<std::byte, frame_header_size> header;  // encoded as on a wire
  std::span<const asio::const_buffer> payload;
  bool done = false;
};

// Frames travelling one way.
struct direction {
  explicit direction(const asio::any_io_executor& ex) : readable(ex), consumed(ex) {}
  std::deque<pending_frame*> queue;
  pending_frame* current = nullptr;  // header delivered, payload not yet
  detail::async_condition readable;  // the receiver waits here
  detail::async_condition consumed;  // senders wait here for `done`
};

struct pipe_state {
  explicit pipe_state(const asio::any_io_executor& ex) : dirs{direction(ex), direction(ex)} {}
  std::array<direction, 2> dirs;  // dirs[i]: frames sent by end i
  int closed_by = -1;             // end that closed first; -1 while open

  void close(int end) {
    if (closed_by < 0) closed_by = end;
    for (auto& d : dirs) {
      d.readable.notify_all();
      d.consumed.notify_all();
    }
  }
};

class end_point final : public transport {
 public:
  end_point(asio::any_io_executor ex, std::shared_ptr<pipe_state> p, int side,
            transport_options opt)
      : ex_(std::move(ex)), pipe_(std::move(p)), side_(side), opt_(opt) {}
  ~end_point() override { close(); }

  asio::any_io_executor get_executor() const override { return ex_; }

  asio::awaitable<std::error_code> send(const frame_header& h,
                                        std::span<const asio::const_buffer> payload) override {
    auto pipe = pipe_;  // keeps the queues alive while this coroutine waits
    if (pipe->closed_by >= 0) co_return closed_error(*pipe);
    if (asio::buffer_size(payload) != h.length) {
      last_error_ = "send: header length differs from the payload size";
      co_return make_error_code(errc::invalid_argument);
    }
    auto& out = pipe->dirs[side_];
    pending_frame f;
    encode_frame_header(h, f.header);
    f.payload = payload;
    out.queue.push_back(&f);
    out.readable.notify_all();
    while (!f.done && pipe->closed_by < 0) {
      if (co_await out.consumed.wait()) {
        // Cancelled. A frame not yet taken can simply be withdrawn; one
        // whose header was delivered cannot, so the connection closes.
        if (f.done) break;
        if (out.current == &f) {
          out.current = nullptr;
          pipe->close(side_);
          co_return make_error_code(errc::closed);
        }
        std::erase(out.queue, &f);
        co_return std::error_code(asio::error::operation_aborted);
      }
    }
    if (f.done) co_return std::error_code{};
    std::erase(out.queue, &f);
    if (out.current == &f) out.current = nullptr;
    co_return closed_error(*pipe);
  }

  asio::awaitable<std::tuple<std::error_code, frame_header>> receive_header() override {
    auto pipe = pipe_;
    auto& in = pipe->dirs[1 - side_];
    if (in.current != nullptr) {
      last_error_ = "receive_header: the previous frame's payload was not received";
      co_return std::tuple{make_error_code(errc::invalid_argument), frame_header{}};
    }
    while (in.queue.empty() && pipe->closed_by < 0) {
      if (co_await in.readable.wait())
        co_return std::tuple{std::error_code(asio::error::operation_aborted), frame_header{}};
    }
    if (pipe->closed_by >= 0) co_return std::tuple{closed_error(*pipe), frame_header{}};
    pending_frame* f = in.queue.front();
    in.queue.pop_front();
    auto h = decode_frame_header(f->header, opt_.max_frame_bytes);
    if (!h) {
      last_error_ = h.message();
      f->done = true;
      pipe->close(side_);
      co_return std::tuple{h.code(), frame_header{}};
    }
    if (h->length == 0) {
      f->done = true;
      in.consumed.notify_all();
    } else {
      in.current = f;
    }
    co_return std::tuple{std::error_code{}, *h};
  }

  asio::awaitable<std::error_code> receive_payload(std::span<std::byte> dest) override {
    auto pipe = pipe_;
    auto& in = pipe->dirs[1 - side_];
    if (pipe->closed_by >= 0) co_return closed_error(*pipe);
    pending_frame* f = in.current;
    if (f == nullptr || asio::buffer_size(f->payload) != dest.size()) {
      last_error_ = "receive_payload: no pending payload of that size";
      co_return make_error_code(errc::invalid_argument);
    }
    asio::buffer_copy(asio::buffer(dest.data(), dest.size()), f->payload);
    f->done = true;
    in.current = nullptr;
    in.consumed.notify_all();
    co_return std::error_code{};
  }

  void close() noexcept override { pipe_->close(side_); }
  bool is_open() const noexcept override { return pipe_->closed_by < 0; }

 private:
  std::error_code closed_error(const pipe_state& p) const {
    return make_error_code(p.closed_by == side_ ? errc::closed : errc::peer_closed);
  }

  asio::any_io_executor ex_;
  std::shared_ptr<pipe_state> pipe_;
  int side_;
  transport_options opt_;
};

}  // namespace

std::pair<std::unique_ptr<transport>, std::unique_ptr<transport>> make_pair(
    asio::any_io_executor ex, transport_options opt) {
  auto pipe = std::make_shared<pipe_state>(ex);
  return {std::make_unique<end_point>(ex, pipe, 0, opt),
          std::make_unique<end_point>(ex, pipe, 1, opt)};
}

}  // namespace blobpipe::loopback
