#include "lib/runtime/async_sync.hpp"

#include <algorithm>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "blobpipe/errors.hpp"

namespace blobpipe::detail {

namespace {
constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

bool is_cancelled(const asio::cancellation_state& cs) noexcept {
  return cs.cancelled() != asio::cancellation_type::none;
}
}  // namespace

asio::awaitable<bool> pause(std::chrono::milliseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  // Nothing else can reach this timer: only cancellation ends it early.
  auto [ec] = co_await t.async_wait(use_tuple);
  co_return ec == asio::error::operation_aborted;
}

async_condition::async_condition(asio::any_io_executor ex) : timer_(std::move(ex)) {
  timer_.expires_at(asio::steady_timer::time_point::max());
}

// The cancellation state is read through this_coro, never by co_await of
// another awaitable once the wait is over: Asio throws operation_aborted
// from such a co_await in a cancelled coroutine (throw_if_cancelled, on by
// default), and the caller is promised `true` instead. A coroutine
// cancelled before it waits does not wait: no signal would come again.
asio::awaitable<bool> async_condition::wait() {
  const auto cs = co_await asio::this_coro::cancellation_state;
  if (is_cancelled(cs)) co_return true;
  co_await timer_.async_wait(use_tuple);
  co_return is_cancelled(cs);
}

asio::awaitable<bool> async_condition::wait_for(std::chrono::milliseconds d) {
  const auto cs = co_await asio::this_coro::cancellation_state;
  if (is_cancelled(cs)) co_return true;
  timer_.expires_after(d);
  co_await timer_.async_wait(use_tuple);
  timer_.expires_at(asio::steady_timer::time_point::max());
  co_return is_cancelled(cs);
}

asio::awaitable<void> async_condition::wait_ignoring_cancellation() {
  // An empty slot: the coroutine's cancellation does not reach the timer.
  co_await timer_.async_wait(asio::bind_cancellation_slot(asio::cancellation_slot(), use_tuple));
}

void async_condition::notify_all() noexcept { timer_.cancel(); }

async_mutex::waiter::waiter(const asio::any_io_executor& ex) : timer(ex) {
  timer.expires_at(asio::steady_timer::time_point::max());
}

asio::awaitable<std::error_code> async_mutex::lock() {
  if (closed_) co_return make_error_code(errc::closed);
  if (!locked_) {
    locked_ = true;
    co_return std::error_code{};
  }
  auto w = std::make_shared<waiter>(ex_);
  waiters_.push_back(w);
  co_await w->timer.async_wait(use_tuple);
  if (w->granted) co_return std::error_code{};  // ownership was handed to us
  std::erase(waiters_, w);
  if (closed_) co_return make_error_code(errc::closed);
  co_return std::error_code(asio::error::operation_aborted);
}

void async_mutex::unlock() noexcept {
  if (waiters_.empty() || closed_) {
    locked_ = false;
    return;
  }
  auto w = std::move(waiters_.front());
  waiters_.pop_front();
  w->granted = true;  // locked_ stays true: the waiter owns it now
  w->timer.cancel();
}

void async_mutex::close() noexcept {
  closed_ = true;
  for (auto& w : waiters_) w->timer.cancel();
}

}  // namespace blobpipe::detail
