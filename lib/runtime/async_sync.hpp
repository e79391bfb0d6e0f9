// Coroutine synchronisation for one executor: a condition (wake all), a
// FIFO mutex, and pause() (a plain sleep). Internal to blobpipe (the timer
// facility, lib/runtime: transport and pipeline).
//
// Both are built on steady_timer waits that never expire on their own:
// cancelling the timer is the wake-up. The waiter re-checks its predicate,
// so a spurious wake is harmless.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <system_error>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

namespace blobpipe::detail {

/// Sleeps `d` on the awaiting coroutine's executor: a backoff or a pause
/// before trying again (an accept that failed for want of descriptors, a
/// resend session's retry_delay). It fails nothing, so it is no timeout: a
/// deadline or the watchdog bounds those (docs/reliability.md "Timeouts").
/// Returns true when the awaiting coroutine was cancelled meanwhile.
asio::awaitable<bool> pause(std::chrono::milliseconds d);

/// How long an accept loop pauses after an accept failed for a reason that
/// may pass (out of descriptors, a connection reset in the backlog) before
/// it accepts again: refusing one connection must neither end the loop nor
/// spin it.
inline constexpr std::chrono::milliseconds accept_retry_pause{10};

/// Wakes every waiter at once.
class async_condition {
 public:
  explicit async_condition(asio::any_io_executor ex);
  /// Suspends until notify_all(). Returns true when the awaiting coroutine
  /// was cancelled (its cancellation state is set: before the wait, which
  /// then does not suspend, or during it), so loops can stop; it does not
  /// throw for cancellation. The caller's own next co_await does, unless
  /// it turned asio::this_coro::throw_if_cancelled off.
  asio::awaitable<bool> wait();
  /// As wait(), for at most `d`: a poll that a notify_all() cuts short (the
  /// waiter re-checks what it waits for either way). One waiter at a time.
  asio::awaitable<bool> wait_for(std::chrono::milliseconds d);
  /// As wait(), but the awaiting coroutine's cancellation neither ends nor
  /// skips it. REQUIRES: the caller turned asio::this_coro::
  /// throw_if_cancelled off (else a cancelled caller throws at the wait).
  asio::awaitable<void> wait_ignoring_cancellation();
  void notify_all() noexcept;

 private:
  asio::steady_timer timer_;
};

/// A mutex whose unlock hands ownership to the longest waiter, so two
/// producers sending chunk after chunk take turns instead of one starving
/// the other.
class async_mutex {
 public:
  explicit async_mutex(asio::any_io_executor ex) : ex_(std::move(ex)) {}
  /// Errors: blobpipe::errc::closed (after close()), operation_aborted
  /// (the waiting coroutine was cancelled).
  asio::awaitable<std::error_code> lock();
  /// Takes the mutex if it is free (no waiter can be passed over then);
  /// false otherwise. The fast path of lock(), without a coroutine.
  bool try_lock() noexcept {
    if (locked_ || closed_) return false;
    locked_ = true;
    return true;
  }
  void unlock() noexcept;
  /// Fails every waiter and every later lock() with closed.
  void close() noexcept;

 private:
  struct waiter {
    explicit waiter(const asio::any_io_executor& ex);
    asio::steady_timer timer;
    bool granted = false;
  };
  asio::any_io_executor ex_;
  bool locked_ = false;
  bool closed_ = false;
  std::deque<std::shared_ptr<waiter>> waiters_;
};

/// Unlocks on scope exit (after a successful lock()).
class unlock_guard {
 public:
  explicit unlock_guard(async_mutex& m) : m_(&m) {}
  unlock_guard(const unlock_guard&) = delete;
  unlock_guard& operator=(const unlock_guard&) = delete;
  ~unlock_guard() { m_->unlock(); }

 private:
  async_mutex* m_;
};

}  // namespace blobpipe::detail
