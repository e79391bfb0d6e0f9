// The bound on a handshake (consumer_options / sender_options
// handshake_timeout), internal: a timer beside the handshake that, when
// the limit passes first, runs `on_expiry` (which closes the transport, so
// the handshake's pending read or write ends). Composed, not threaded
// through (STYLE.md rule 9): the handshake itself knows nothing of it.
//
//   handshake_deadline d(ex, opt.handshake_timeout, [weak] { ...close... });
//   ... the handshake ...
//   if (failed && d.expired()) ec = timed_out;
//
// Going out of scope (the handshake over) disarms it, also when the timer
// has fired but its handler has not run yet.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <system_error>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/steady_timer.hpp>

namespace blobpipe::detail {

class handshake_deadline {
 public:
  /// `limit` 0 (or below): no bound.
  handshake_deadline(const asio::any_io_executor& ex, std::chrono::milliseconds limit,
                     std::function<void()> on_expiry)
      : state_(std::make_shared<state>()), timer_(ex) {
    if (limit.count() <= 0) return;
    timer_.expires_after(limit);
    timer_.async_wait([st = state_, f = std::move(on_expiry)](std::error_code ec) {
      if (ec || st->over) return;
      st->expired = true;
      f();
    });
  }
  ~handshake_deadline() {
    state_->over = true;
    timer_.cancel();
  }
  handshake_deadline(const handshake_deadline&) = delete;
  handshake_deadline& operator=(const handshake_deadline&) = delete;

  /// Whether the limit passed (and on_expiry ran).
  bool expired() const noexcept { return state_->expired; }

 private:
  struct state {
    bool over = false;
    bool expired = false;
  };
  std::shared_ptr<state> state_;
  asio::steady_timer timer_;
};

}  // namespace blobpipe::detail
