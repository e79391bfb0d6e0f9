#include "lib/runtime/task_group.hpp"

#include <iterator>
#include <utility>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/post.hpp>

namespace blobpipe::detail {

task_group::task_group(asio::any_io_executor ex)
    : state_(std::make_shared<state>(std::move(ex))) {}

void task_group::spawn(asio::awaitable<void> task) { spawn(state_->home, std::move(task)); }

void task_group::spawn(const asio::any_io_executor& ex, asio::awaitable<void> task) {
  auto t = std::make_shared<struct task>();
  t->ex = ex;
  std::list<std::shared_ptr<struct task>>::iterator it;
  {
    std::lock_guard lk(state_->m);
    if (state_->cancelled) return;  // `task` goes unrun
    state_->tasks.push_back(t);
    it = std::prev(state_->tasks.end());
  }
  // The handler keeps the task's signal alive until it has run: the slot it
  // binds lives in that signal.
  auto ended = [st = state_, t, it](std::exception_ptr e) {
    {
      std::lock_guard lk(st->m);
      st->tasks.erase(it);
      if (e) ++st->failures;
    }
    asio::post(st->home, [st] { st->done.notify_all(); });
  };
  asio::co_spawn(ex, std::move(task),
                 asio::bind_cancellation_slot(t->signal.slot(), std::move(ended)));
}

void task_group::cancel_one(const std::shared_ptr<task>& t) noexcept {
  try {
    asio::dispatch(t->ex, [t] { t->signal.emit(asio::cancellation_type::terminal); });
  } catch (...) {  // out of memory for the handler: that task stops on its own at close
  }
}

void task_group::cancel() noexcept {
  std::list<std::shared_ptr<task>> running;
  {
    std::lock_guard lk(state_->m);
    state_->cancelled = true;
    try {
      running = state_->tasks;
    } catch (...) {  // out of memory: the tasks stop on their own at close
      return;
    }
  }
  for (const auto& t : running) cancel_one(t);
}

bool task_group::cancelled() const noexcept {
  std::lock_guard lk(state_->m);
  return state_->cancelled;
}

asio::awaitable<void> task_group::join() {
  // A task that ends after the check posts its notify to this executor,
  // where it runs only once this coroutine waits.
  // (The wait's result in a statement of its own: GCC 12 mis-compiles a
  // co_await inside an if's condition here.)
  while (running() != 0) {
    const bool joiner_cancelled = co_await state_->done.wait();
    if (joiner_cancelled) break;
  }
}

std::size_t task_group::running() const noexcept {
  std::lock_guard lk(state_->m);
  return state_->tasks.size();
}

std::uint64_t task_group::failures() const noexcept {
  std::lock_guard lk(state_->m);
  return state_->failures;
}

}  // namespace blobpipe::detail
