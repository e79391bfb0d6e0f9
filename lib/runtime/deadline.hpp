// A bounded wait (internal; the timer facility, lib/runtime): the one tool
// for a limit on how long one wait may take as a whole, and for an action
// due after a delay unless disarmed first (a linger, a backoff's next
// pass). A timer beside the wait that, when the limit passes first, runs
// `on_expiry` once; on_expiry ends what the wait is blocked on (closes the
// transport, cancels the connect), so the wait fails, and the waiter turns
// that failure into timed_out with reason(). Composed, not threaded
// through: the wait itself knows nothing of it.
//
//   deadline d(ex, opt.handshake_timeout, [weak] { ...close... });
//   ... the handshake ...
//   if (failed && d.expired())
//     return {errc::timed_out, d.reason("no handshake with the sender", "handshake_timeout")};
//
// Going out of scope (the wait over) disarms it, also when the timer has
// fired but its handler has not run yet: on_expiry never runs after that.
// on_expiry may destroy the deadline that runs it (a std::optional reset or
// re-armed): the handler holds what it needs. The waiter must run on the
// deadline's executor (one thread, or a strand): its state is not atomic,
// and on_expiry runs there.
//
// Used by: the consumer's and the sender's handshake (handshake_timeout),
// the fan-in server's per-connection handshake (server_options
// handshake_timeout), a resend session's connection attempt, connect and
// handshake together (sender_options stall_timeout), a UCX rendezvous;
// and for lingers and a backoff: a consumer's close frame (close_linger),
// a UCX connection's close, the UCX worker's busy backoff; keep_alive_for
// (below) holds a UCX worker past a failed wire-up.
//
// Not for limits measured in progress (stall_timeout, idle_timeout,
// held_timeout while a connection runs): the watchdog is the one tool for
// those (lib/runtime/watchdog.hpp), since a slow but moving peer must not
// trip them. A coroutine's own sleep (a resend session's retry_delay, an
// accept loop's pause when descriptors run out) is pause()
// (lib/runtime/async_sync.hpp). docs/reliability.md "Timeouts" lists every
// limit and which tool bounds it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/steady_timer.hpp>

namespace blobpipe::detail {

class deadline {
 public:
  /// Arms the deadline on `ex`: after `limit` (milliseconds) it runs
  /// `on_expiry` once, on `ex`, unless disarmed (destroyed) first.
  /// `limit` 0 (or below): no bound; on_expiry never runs. Throws only
  /// what allocating its shared state throws (std::bad_alloc).
  deadline(const asio::any_io_executor& ex, std::chrono::milliseconds limit,
           std::function<void()> on_expiry)
      : state_(std::make_shared<state>()), timer_(ex), limit_(limit) {
    if (limit.count() <= 0) return;
    timer_.expires_after(limit);
    timer_.async_wait([st = state_, f = std::move(on_expiry)](std::error_code ec) {
      if (ec || st->over) return;
      st->expired = true;
      f();
    });
  }
  ~deadline() {
    state_->over = true;
    timer_.cancel();
  }
  deadline(const deadline&) = delete;
  deadline& operator=(const deadline&) = delete;

  /// Whether the limit passed (and on_expiry ran).
  bool expired() const noexcept { return state_->expired; }
  /// The limit, milliseconds (0 or below: none).
  std::chrono::milliseconds limit() const noexcept { return limit_; }
  /// The reason for the timed_out error: "<what> within <limit> ms (<option>)",
  /// `option` naming the setting that holds the limit.
  std::string reason(std::string_view what, std::string_view option) const {
    return reason(what, limit_, option);
  }
  static std::string reason(std::string_view what, std::chrono::milliseconds limit,
                            std::string_view option) {
    return std::string(what) + " within " + std::to_string(limit.count()) + " ms (" +
           std::string(option) + ")";
  }

 private:
  struct state {
    bool over = false;
    bool expired = false;
  };
  std::shared_ptr<state> state_;
  asio::steady_timer timer_;
  std::chrono::milliseconds limit_;
};

/// A linger without a waiter: keeps `owner` alive for `d` more on `ex`,
/// whoever else still owns it (a UCX worker whose failed wire-up may
/// still be answered, runtime::hold_for). The timer owns itself; nothing
/// to disarm. Throws only std::bad_alloc.
inline void keep_alive_for(const asio::any_io_executor& ex, std::chrono::milliseconds d,
                           std::shared_ptr<const void> owner) {
  auto timer = std::make_shared<asio::steady_timer>(ex, d);
  timer->async_wait([timer, owner = std::move(owner)](std::error_code) {});
}

}  // namespace blobpipe::detail
