// In-process transport pair (docs/wire.md "Transport"). A write parks its
// gather list in the pipe and waits until the reader has copied every byte
// out of it: one copy, no staging buffer. The ends may run on two threads:
// the pipe's state is guarded by one mutex, and waits end through
// detail::cross_wait, which resumes each coroutine on its own executor.
#include "blobpipe/transport/loopback.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <vector>

#include <asio/buffer.hpp>
#include <asio/error.hpp>

#include "lib/transport/cross_wait.hpp"

namespace blobpipe::loopback {
namespace {

// Bytes travelling one way: at most one write parked at a time.
struct direction {
  explicit direction(std::mutex& m) : readable(m), consumed(m) {}
  std::vector<asio::const_buffer> parked;  // the writer's buffers (not copied)
  std::size_t at = 0;                      // buffer being read
  std::size_t offset = 0;                  // bytes of parked[at] read
  bool writing = false;
  detail::cross_wait readable;  // the reader waits here for a write
  detail::cross_wait consumed;  // the writer waits here for its bytes to be read

  bool untouched() const noexcept { return at == 0 && offset == 0; }

  /// Copies parked bytes into `out`; returns how many.
  std::size_t take(std::span<std::byte> out) noexcept {
    std::size_t n = 0;
    while (n < out.size() && at < parked.size()) {
      const auto& b = parked[at];
      const std::size_t k = std::min(out.size() - n, b.size() - offset);
      std::memcpy(out.data() + n, static_cast<const std::byte*>(b.data()) + offset, k);
      n += k;
      offset += k;
      if (offset == b.size()) ++at, offset = 0;
    }
    if (at == parked.size()) {  // all read: the write completes
      writing = false;
      consumed.wake();
    }
    return n;
  }
};

struct pipe_state {
  pipe_state() : dirs{direction(m), direction(m)} {}
  std::mutex m;
  std::array<direction, 2> dirs;  // dirs[i]: bytes written by end i
  int closed_by = -1;             // end that closed first; -1 while open

  // REQUIRES: m held.
  void close_locked(int end) noexcept {
    if (closed_by < 0) closed_by = end;
    for (auto& d : dirs) {
      d.readable.wake();
      d.consumed.wake();
    }
  }
};

class end_point final : public transport {
 public:
  end_point(asio::any_io_executor ex, std::shared_ptr<pipe_state> p, int side)
      : ex_(std::move(ex)), pipe_(std::move(p)), side_(side) {}
  ~end_point() override { close(); }

  asio::any_io_executor get_executor() const override { return ex_; }

  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) override {
    auto pipe = pipe_;  // keeps the pipe alive while this coroutine waits
    std::unique_lock lk(pipe->m);
    if (pipe->closed_by >= 0) co_return closed_error(*pipe);
    auto& out = pipe->dirs[side_];
    out.parked.clear();
    for (const auto& b : bytes)
      if (b.size() != 0) out.parked.push_back(b);
    if (out.parked.empty()) co_return std::error_code{};
    out.at = out.offset = 0;
    out.writing = true;
    out.readable.wake();
    while (out.writing && pipe->closed_by < 0) {
      const bool cancelled = co_await out.consumed.wait(lk);
      lk.lock();
      if (!cancelled || !out.writing) continue;
      // Cancelled. Bytes nobody has read yet can simply be withdrawn; a
      // write read in part cannot, so the connection closes.
      out.writing = false;
      if (out.untouched()) co_return std::error_code(asio::error::operation_aborted);
      pipe->close_locked(side_);
      co_return make_error_code(errc::closed);
    }
    if (!out.writing) co_return std::error_code{};
    out.writing = false;
    co_return closed_error(*pipe);
  }

  asio::awaitable<std::tuple<std::error_code, read_result>> read_some(
      std::span<std::byte> buf) override {
    auto pipe = pipe_;
    std::unique_lock lk(pipe->m);
    auto& in = pipe->dirs[1 - side_];
    while (!in.writing && pipe->closed_by < 0) {
      const bool cancelled = co_await in.readable.wait(lk);
      if (cancelled)
        co_return std::tuple{std::error_code(asio::error::operation_aborted), read_result{}};
      lk.lock();
    }
    if (pipe->closed_by >= 0) co_return std::tuple{closed_error(*pipe), read_result{}};
    co_return std::tuple{std::error_code{}, read_result{in.take(buf), 0}};
  }

  bool readable() const noexcept override {
    std::lock_guard g(pipe_->m);
    return pipe_->dirs[1 - side_].writing || pipe_->closed_by >= 0;
  }

  asio::awaitable<std::error_code> read_exact(std::span<std::byte> dest) override {
    for (std::size_t done = 0; done < dest.size();) {
      auto [ec, got] = co_await read_some(dest.subspan(done));
      if (ec) co_return ec;
      done += got.bytes;
    }
    co_return std::error_code{};
  }

  void close() noexcept override {
    std::lock_guard g(pipe_->m);
    pipe_->close_locked(side_);
  }

  bool is_open() const noexcept override {
    std::lock_guard g(pipe_->m);
    return pipe_->closed_by < 0;
  }

 private:
  // REQUIRES: the pipe's mutex held.
  std::error_code closed_error(const pipe_state& p) const {
    return make_error_code(p.closed_by == side_ ? errc::closed : errc::peer_closed);
  }

  asio::any_io_executor ex_;
  std::shared_ptr<pipe_state> pipe_;
  int side_;
};

}  // namespace

std::pair<std::unique_ptr<transport>, std::unique_ptr<transport>> make_pair(
    asio::any_io_executor ex, transport_options opt) {
  return make_pair(ex, ex, opt);
}

std::pair<std::unique_ptr<transport>, std::unique_ptr<transport>> make_pair(
    asio::any_io_executor ex_a, asio::any_io_executor ex_b, transport_options) {
  auto pipe = std::make_shared<pipe_state>();
  return {std::make_unique<end_point>(std::move(ex_a), pipe, 0),
          std::make_unique<end_point>(std::move(ex_b), pipe, 1)};
}

}  // namespace blobpipe::loopback
