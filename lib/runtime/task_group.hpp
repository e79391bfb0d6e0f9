// Coroutines with an owner (internal; lib/runtime, beside the timers): a
// task spawned through a task_group belongs to it until it ends. cancel()
// asks every task still running to stop (terminal cancellation, through the
// slot bound to it), and join() completes once none runs, so the owner's
// close can wait for what it started instead of leaving it detached
// (CONTRIBUTING.md "Coroutines, ownership and close"; Asio's cpp20
// examples bind a cancellation slot the same way).
//
//   task_group tasks(ex);                       // a member of the owner
//   tasks.spawn(ack_loop(state));               // on the group's executor
//   tasks.spawn(other_ex, serve(state, conn));  // or on another one
//   ...
//   tasks.cancel();                             // the owner closes
//   co_await tasks.join();                      // on the group's executor
//
// A task that should stop on its own at close (its socket closed, its
// condition notified) stops that way; cancel() is for the ones that would
// otherwise wait on. An exception a task lets out ends that task only and
// is counted (failures()), as asio::detached would drop it.
//
// Threading: spawn() and cancel() may be called from any thread; each
// task's cancellation is emitted on the task's own executor (Asio's
// cancellation signals are not thread-safe). join() runs on the group's
// executor. The group's state outlives the group object while tasks run
// (they hold it), so destroying the group does not cancel or wait: close
// first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_signal.hpp>

#include "lib/runtime/async_sync.hpp"

namespace blobpipe::detail {

class task_group {
 public:
  /// A group whose join() runs on `ex` (and whose tasks run there unless
  /// spawned on another executor).
  explicit task_group(asio::any_io_executor ex);
  task_group(const task_group&) = delete;
  task_group& operator=(const task_group&) = delete;

  /// Starts `task` on the group's executor, owned by the group.
  void spawn(asio::awaitable<void> task);
  /// Starts `task` on `ex`, owned by the group.
  void spawn(const asio::any_io_executor& ex, asio::awaitable<void> task);

  /// Asks every task still running to stop: emits terminal cancellation on
  /// each one's executor. A task spawned after this is not started (its
  /// frame is destroyed unrun). Idempotent, never throws.
  void cancel() noexcept;
  /// Whether cancel() was called.
  bool cancelled() const noexcept;

  /// Completes once no task runs (at once if none does), or when the
  /// joining coroutine is cancelled. Run on the group's executor; one
  /// joiner at a time.
  asio::awaitable<void> join();

  /// Tasks started and not yet ended.
  std::size_t running() const noexcept;
  /// Tasks that ended with an exception.
  std::uint64_t failures() const noexcept;

 private:
  struct task {
    asio::any_io_executor ex;
    asio::cancellation_signal signal;
  };
  struct state {
    explicit state(asio::any_io_executor e) : home(e), done(std::move(e)) {}
    asio::any_io_executor home;
    mutable std::mutex m;
    std::list<std::shared_ptr<task>> tasks;  // running, under m
    std::uint64_t failures = 0;              // under m
    bool cancelled = false;                  // under m
    async_condition done;                    // home only: a task ended
  };
  /// Emits terminal cancellation for `t` on its executor.
  static void cancel_one(const std::shared_ptr<task>& t) noexcept;
  std::shared_ptr<state> state_;
};

}  // namespace blobpipe::detail
