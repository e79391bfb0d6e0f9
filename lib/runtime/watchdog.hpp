// A stall watchdog (internal): runs beside a connection's coroutines and
// notices when the side has been waiting on its peer for too long with
// nothing arriving. The timer facility's one tool (lib/runtime) for limits
// measured in progress (stall_timeout, idle_timeout, held_timeout); a
// limit on one wait as a whole (a handshake, a connection attempt) is a
// deadline
// (lib/runtime/deadline.hpp); docs/reliability.md "Timeouts". Composed,
// not threaded through (STYLE.md rule 9): the workers only mark when they
// start and stop waiting and when bytes arrive; the watchdog's own
// coroutine sleeps on one timer and checks.
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
// The decision is check(now), one tick's worth, and the clock is a
// function given at construction (steady_clock by default), so a test
// drives every limit with a clock of its own (test/watchdog_test.cpp;
// target //lib/runtime).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

namespace blobpipe::detail {

class watchdog {
 public:
  using clock = std::chrono::steady_clock;
  using ms = std::chrono::milliseconds;
  /// Where the watchdog reads the time (no state: a plain function).
  using now_fn = clock::time_point (*)() noexcept;
  static clock::time_point steady_now() noexcept { return clock::now(); }

  /// `stall`: longest wait without progress (see progress()) while the
  /// peer owes bytes (see owes()); `idle`: longest wait with nothing arriving at all. Zero
  /// disables a limit; with both zero expired() just waits for stop().
  /// `held`: longest wait while held() is true with nothing arriving
  /// (consumer_options::held_timeout). `now`: the clock every mark and
  /// check reads (the timer still sleeps `tick` of real time).
  watchdog(asio::any_io_executor ex, ms stall, ms idle, ms held = ms(0),
           now_fn now = &steady_now);

  bool enabled() const noexcept {
    return stall_.count() > 0 || idle_.count() > 0 || held_.count() > 0;
  }
  /// How often expired() checks: a quarter of the shortest limit, at least 1 ms.
  ms tick() const noexcept { return tick_; }

  /// Bytes a receiver must see arrive within `stall` (or an entry or blob
  /// end) to count as progress: the least rate a peer that owes bytes may
  /// keep, 1 MiB per stall timeout.
  static constexpr std::uint64_t progress_bytes = 1u << 20;

  /// A wait on the peer starts / ends (nests: counted). The stall clock
  /// counts only time spent waiting.
  void begin_wait() noexcept;
  void end_wait() noexcept;
  /// Bytes arrived (or a send completed): the silence starts over, and it
  /// is progress.
  void progress() noexcept {
    if (!enabled()) return;
    last_ = advanced_ = now_();
    pressed_for_ = clock::duration::zero();
  }
  /// A receiver's progress: `bytes` of admitted entries and tails in all so
  /// far (decoder::admitted_bytes), `items` entries and blobs completed in
  /// all so far. Any call ends a silence (idle, held); only an item
  /// completed or progress_bytes more bytes restart the stall and pressed
  /// clocks (so a peer trickling a byte at a time, or sending only control
  /// frames, stalls).
  void progress(std::uint64_t bytes, std::uint64_t items) noexcept;
  /// Whether the peer owes bytes now (a frame begun, a blob open); only
  /// then does `stall` apply, counted from when it began to owe (time it
  /// spent waiting for credit the application held is not its).
  void owes(bool v) noexcept {
    if (v && !owes_ && enabled()) advanced_ = now_();
    owes_ = v;
  }
  /// Whether the application holds what the sender may be waiting for
  /// (the held allowance is full and part of the window is held, and the
  /// application waits); `held` counts from when it became true.
  /// Credit pressure (credit_pool::pressed): while `f` returns true the
  /// peer holds credit others need. The time `f` is seen true while
  /// waiting adds up until the next progress (progress(bytes, items): an
  /// entry or blob completed, or progress_bytes more admitted bytes), and
  /// `stall` of it ends the connection. Pressure that lapses and returns
  /// resumes the count. Checked each tick.
  void pressure(std::function<bool()> f) { pressed_ = std::move(f); }
  void held(bool v) noexcept {
    if (v && !held_on_ && enabled()) held_since_ = now_();
    held_on_ = v;
  }

  /// Completes with true once a limit is exceeded while waiting, or false
  /// after stop(): sleeps `tick`, then check(now), until one trips. One
  /// caller at a time.
  asio::awaitable<bool> expired();
  /// Which limit tripped. An enum, not its name: a comparison of name
  /// pointers differs between translation units wherever the compiler
  /// does not merge equal literals (ASan's redzones, for one).
  enum class limit_kind { stall, idle, held, pressed };
  /// One tick's decision at time `now`: the limit exceeded (also kept for
  /// tripped()), or none. Nothing is exceeded while no wait is open
  /// (begin_wait), nor after stop(). In this order: idle (silent for
  /// `idle`), stall (owed, no progress for `stall`), pressed (pressure()
  /// seen true, while waiting, for `stall` in all since the last
  /// progress), held (held() true and silent for `held`).
  std::optional<limit_kind> check(clock::time_point now);
  limit_kind tripped() const noexcept { return tripped_; }
  /// Its name, for the error message: "stall", "idle" or "held".
  const char* tripped_name() const noexcept {
    return tripped_ == limit_kind::idle ? "idle" : tripped_ == limit_kind::held ? "held" : "stall";
  }
  ms limit() const noexcept {
    if (tripped_ == limit_kind::pressed) return stall_;
    return tripped_ == limit_kind::idle ? idle_ : tripped_ == limit_kind::held ? held_ : stall_;
  }

  /// Ends expired() with false; idempotent.
  void stop() noexcept;

 private:
  asio::steady_timer timer_;
  ms stall_, idle_, held_, tick_;
  now_fn now_;
  clock::time_point last_{};
  clock::time_point held_since_{};
  clock::time_point advanced_{};     // the last progress (stall, pressed)
  clock::time_point wait_ended_{};   // when the last wait ended (none: epoch)
  std::uint64_t bytes_mark_ = 0;     // bytes in at the last progress
  std::uint64_t items_mark_ = 0;     // items ended at the last progress
  bool counted_ = false;             // progress(bytes, items) in use
  std::function<bool()> pressed_;
  clock::time_point pressed_seen_{};       // the last check that saw pressure
  clock::duration pressed_for_{};          // pressed since the last progress, in all
  bool pressed_on_ = false;                // the last check saw pressure
  bool held_on_ = false;
  std::uint32_t waiting_ = 0;
  bool owes_ = false;
  bool stopped_ = false;
  limit_kind tripped_ = limit_kind::stall;
};

}  // namespace blobpipe::detail
