// A stall watchdog (internal): runs beside a sender's coroutines and
// notices when it has been waiting on its peer for too long with nothing
// arriving. The decisions are progress_clocks' (progress_clocks.hpp: the
// limits measured in progress, with the time passed in); the watchdog
// reads the clock for each mark and runs the timer that checks them. A
// limit on one wait as a whole (a handshake, a connection attempt) is a
// deadline (lib/runtime/deadline.hpp); docs/reliability.md "Timeouts".
// Composed, not threaded through (Asio's cpp20 timeout example): the
// workers only mark when they start and stop waiting and when bytes
// arrive; the watchdog's own coroutine sleeps on one timer and checks.
// (A consumer's clocks are its session's, driven by the consumer's own
// timer: consumer.cpp.)
//
//   asio::co_spawn(ex, [s]() -> asio::awaitable<void> {
//     if (co_await s->dog.expired()) s->on_stall();   // holds `s` alive
//   }, asio::detached);
//   s->dog.begin_wait(); ...co_await read...; s->dog.progress(); s->dog.end_wait();
//
// It checks every `tick` (a quarter of the shortest limit), so a stall is
// reported between `limit` and `limit + tick` after the last progress. No
// timer is touched per frame: marking costs a clock read.
//
// The clock is a function given at construction (steady_clock by
// default), so a test drives every limit with a clock of its own
// (test/watchdog_test.cpp; target //lib/runtime).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

#include "lib/runtime/progress_clocks.hpp"

namespace blobpipe::detail {

class watchdog {
 public:
  using clock = progress_clocks::clock;
  using ms = std::chrono::milliseconds;
  /// Where the watchdog reads the time (no state: a plain function).
  using now_fn = clock::time_point (*)() noexcept;
  static clock::time_point steady_now() noexcept { return clock::now(); }

  /// `stall`: longest wait without progress (see progress()) while the
  /// peer owes bytes (see owes()); `idle`: longest wait with nothing
  /// arriving at all. Zero disables a limit; with both zero expired() just
  /// waits for stop(). `held`: longest wait while held() is true with
  /// nothing arriving. `now`: the clock every mark and check reads (the
  /// timer still sleeps `tick` of real time).
  watchdog(asio::any_io_executor ex, ms stall, ms idle, ms held = ms(0),
           now_fn now = &steady_now);

  bool enabled() const noexcept { return clocks_.enabled(); }
  /// How often expired() checks: a quarter of the shortest limit, at least 1 ms.
  ms tick() const noexcept { return clocks_.tick(); }

  /// progress_clocks::progress_bytes.
  static constexpr std::uint64_t progress_bytes = progress_clocks::progress_bytes;

  /// A wait on the peer starts / ends (nests: counted).
  void begin_wait() noexcept { clocks_.begin_wait(now_()); }
  void end_wait() noexcept { clocks_.end_wait(now_()); }
  /// Bytes arrived (or a send completed): the silence starts over, and it
  /// is progress.
  void progress() noexcept {
    if (enabled()) clocks_.progress(now_());
  }
  /// A receiver's progress (progress_clocks::progress(bytes, items, now)).
  void progress(std::uint64_t bytes, std::uint64_t items) noexcept {
    if (enabled()) clocks_.progress(bytes, items, now_());
  }
  /// Whether the peer owes bytes now (progress_clocks::owes).
  void owes(bool v) noexcept { clocks_.owes(v, enabled() ? now_() : clock::time_point{}); }
  /// Credit pressure (credit_pool::pressed): while `f` returns true the
  /// peer holds credit others need (progress_clocks::check). Checked each tick.
  void pressure(std::function<bool()> f) { pressed_ = std::move(f); }
  /// Whether the application holds what the sender may be waiting for
  /// (progress_clocks::held).
  void held(bool v) noexcept { clocks_.held(v, enabled() ? now_() : clock::time_point{}); }

  /// Completes with true once a limit is exceeded while waiting, or false
  /// after stop(): sleeps `tick`, then check(now), until one trips. One
  /// caller at a time.
  asio::awaitable<bool> expired();
  using limit_kind = progress_clocks::limit_kind;
  /// One tick's decision at time `now` (progress_clocks::check, asking
  /// pressure() only when it counts).
  std::optional<limit_kind> check(clock::time_point now) {
    const bool pressed = clocks_.pressure_counts() && pressed_ && pressed_();
    return clocks_.check(now, pressed);
  }
  limit_kind tripped() const noexcept { return clocks_.tripped(); }
  /// Its name, for the error message: "stall", "idle" or "held".
  const char* tripped_name() const noexcept { return clocks_.tripped_name(); }
  ms limit() const noexcept { return clocks_.limit(); }

  /// Ends expired() with false; idempotent.
  void stop() noexcept;

 private:
  asio::steady_timer timer_;
  progress_clocks clocks_;
  now_fn now_;
  std::function<bool()> pressed_;
};

}  // namespace blobpipe::detail
