// The limits measured in progress (internal; docs/reliability.md
// "Timeouts"), as plain state with the time passed in: stall_timeout,
// idle_timeout, held_timeout and credit pressure. No clock is read and no
// timer runs here: the owner marks when a wait on the peer begins and
// ends, when bytes arrive and what progress they make, and asks check(now)
// from a timer of its own every tick(). The consumer session
// (blobpipe/protocol/consumer_session.hpp) owns one and is driven by the
// consumer's timer; the watchdog (watchdog.hpp) wraps one for the senders.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace blobpipe::detail {

class progress_clocks {
 public:
  using clock = std::chrono::steady_clock;
  using time_point = clock::time_point;
  using ms = std::chrono::milliseconds;

  /// Bytes a receiver must see arrive within `stall` (or an entry or blob
  /// end) to count as progress: the least rate a peer that owes bytes may
  /// keep, 1 MiB per stall timeout.
  static constexpr std::uint64_t progress_bytes = 1u << 20;

  /// `stall`: longest wait without progress while the peer owes bytes
  /// (owes()); `idle`: longest wait with nothing arriving at all; `held`:
  /// longest wait while held() is true with nothing arriving. Zero
  /// disables a limit.
  explicit progress_clocks(ms stall = ms(0), ms idle = ms(0), ms held = ms(0));

  bool enabled() const noexcept {
    return stall_.count() > 0 || idle_.count() > 0 || held_.count() > 0;
  }
  /// How often the owner should call check(): a quarter of the shortest
  /// limit, at least 1 ms; so a limit is reported between `limit` and
  /// `limit + tick` after it began.
  ms tick() const noexcept { return tick_; }

  /// A wait on the peer starts / ends at `now` (nests: counted). The stall
  /// clock counts only time spent waiting.
  void begin_wait(time_point now) noexcept;
  void end_wait(time_point now) noexcept;
  /// Bytes arrived (or a send completed) at `now`: the silence starts
  /// over, and it is progress.
  void progress(time_point now) noexcept {
    if (!enabled()) return;
    last_ = advanced_ = now;
    pressed_for_ = clock::duration::zero();
  }
  /// A receiver's progress at `now`: `bytes` of admitted entries and tails
  /// in all so far (decoder::admitted_bytes), `items` entries and blobs
  /// completed in all so far. Any call ends a silence (idle, held); only an
  /// item completed or progress_bytes more bytes restart the stall and
  /// pressed clocks (so a peer trickling a byte at a time, or sending only
  /// control frames, stalls).
  void progress(std::uint64_t bytes, std::uint64_t items, time_point now) noexcept;
  /// Whether the peer owes bytes from `now` on; only then does `stall`
  /// apply, counted from when it began to owe.
  void owes(bool v, time_point now) noexcept {
    if (v && !owes_ && enabled()) advanced_ = now;
    owes_ = v;
  }
  /// Whether the application holds what the sender may be waiting for from
  /// `now` on; `held` counts from when it became true.
  void held(bool v, time_point now) noexcept {
    if (v && !held_on_ && enabled()) held_since_ = now;
    held_on_ = v;
  }

  /// Which limit tripped. An enum, not its name: a comparison of name
  /// pointers differs between translation units wherever the compiler
  /// does not merge equal literals (ASan's redzones, for one).
  enum class limit_kind { stall, idle, held, pressed };
  /// Whether check() would ask about credit pressure now (a stall limit,
  /// a wait open, not stopped): the owner need not ask its pool otherwise.
  bool pressure_counts() const noexcept {
    return stall_.count() > 0 && waiting_ != 0 && !stopped_;
  }
  /// One tick's decision at time `now`: the limit exceeded (also kept for
  /// tripped()), or none. `pressed`: the peer holds credit others need
  /// now (credit_pool::pressed); the time it is seen true while waiting
  /// adds up until the next progress, and `stall` of it trips. Nothing is
  /// exceeded while no wait is open, nor after stop(). In this order: idle
  /// (silent for `idle`), stall (owed, no progress for `stall`), pressed,
  /// held (held() true and silent for `held`).
  std::optional<limit_kind> check(time_point now, bool pressed);
  limit_kind tripped() const noexcept { return tripped_; }
  /// Its name, for the error message: "stall", "idle" or "held".
  const char* tripped_name() const noexcept {
    return tripped_ == limit_kind::idle ? "idle" : tripped_ == limit_kind::held ? "held" : "stall";
  }
  ms limit() const noexcept {
    if (tripped_ == limit_kind::pressed) return stall_;
    return tripped_ == limit_kind::idle ? idle_ : tripped_ == limit_kind::held ? held_ : stall_;
  }

  /// Whether a wait is open (begin_wait without its end_wait).
  bool waiting() const noexcept { return waiting_ != 0; }
  /// Nothing trips from now on; idempotent.
  void stop() noexcept { stopped_ = true; }
  bool stopped() const noexcept { return stopped_; }

 private:
  ms stall_, idle_, held_, tick_;
  time_point last_{};
  time_point held_since_{};
  time_point advanced_{};     // the last progress (stall, pressed)
  time_point wait_ended_{};   // when the last wait ended (none: epoch)
  std::uint64_t bytes_mark_ = 0;     // bytes in at the last progress
  std::uint64_t items_mark_ = 0;     // items ended at the last progress
  bool counted_ = false;             // progress(bytes, items, now) in use
  time_point pressed_seen_{};        // the last check that saw pressure
  clock::duration pressed_for_{};    // pressed since the last progress, in all
  bool pressed_on_ = false;          // the last check saw pressure
  bool held_on_ = false;
  std::uint32_t waiting_ = 0;
  bool owes_ = false;
  bool stopped_ = false;
  limit_kind tripped_ = limit_kind::stall;
};

}  // namespace blobpipe::detail
