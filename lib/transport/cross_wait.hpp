// A wait that another thread may end (internal): the two ends of the
// in-process loopback may run on different threads, each on its own
// io_context. State is guarded by a caller's mutex; the waiting coroutine
// registers itself under that mutex, so a wake between its check and its
// wait cannot be lost, and resumes on its own executor.
//
//   std::unique_lock lk(m);
//   while (!ready) {
//     if (co_await readable.wait(lk)) ...;   // cancelled; lk is unlocked
//     lk.lock();
//   }
//   // elsewhere, any thread:  { std::lock_guard g(m); ready = true; readable.wake(); }
#pragma once

#include <memory>
#include <mutex>
#include <utility>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

namespace blobpipe::detail {

/// One waiter at a time; wake() and the wait's cancellation may come from
/// any thread, always under the mutex the waiter passed in.
class cross_wait {
 public:
  explicit cross_wait(std::mutex& m) : mutex_(&m) {}
  cross_wait(const cross_wait&) = delete;
  cross_wait& operator=(const cross_wait&) = delete;

  /// Suspends until wake(). REQUIRES: `lk` holds the mutex; it is unlocked
  /// once the waiter is registered and stays unlocked on return. Returns
  /// true when the awaiting coroutine was cancelled, also when the
  /// cancellation came after wake() but before it resumed.
  asio::awaitable<bool> wait(std::unique_lock<std::mutex>& lk) {
    const bool cancelled = co_await park(lk);
    const auto state = co_await asio::this_coro::cancellation_state;
    co_return cancelled || state.cancelled() != asio::cancellation_type::none;
  }

  /// Ends the wait, if any. REQUIRES: the caller holds the mutex.
  void wake() noexcept {
    if (waiter_) std::exchange(waiter_, nullptr)->complete(false);
  }

 private:
  asio::awaitable<bool> park(std::unique_lock<std::mutex>& lk) {
    return asio::async_initiate<decltype(asio::use_awaitable), void(bool)>(
        [this, &lk](auto handler) {
          auto w = std::make_unique<waiter<decltype(handler)>>(std::move(handler));
          if (w->slot.is_connected()) w->slot.template emplace<canceller>(this);
          waiter_ = std::move(w);
          lk.unlock();
        },
        asio::use_awaitable);
  }

  struct waiter_base {
    virtual ~waiter_base() = default;
    virtual void complete(bool cancelled) noexcept = 0;
  };

  template <class Handler>
  struct waiter final : waiter_base {
    explicit waiter(Handler h)
        : handler(std::move(h)),
          slot(asio::get_associated_cancellation_slot(handler)),
          // Counted as work, so the waiter's io_context keeps running.
          work(asio::prefer(asio::get_associated_executor(handler),
                            asio::execution::outstanding_work.tracked)) {}
    void complete(bool cancelled) noexcept override {
      try {
        asio::post(work, [h = std::move(handler), s = slot, cancelled]() mutable {
          if (s.is_connected()) s.clear();
          std::move(h)(cancelled);
        });
      } catch (...) {  // out of memory for the handler: nothing to resume
      }
    }
    Handler handler;
    asio::cancellation_slot slot;
    decltype(asio::prefer(std::declval<asio::associated_executor_t<Handler>>(),
                          asio::execution::outstanding_work.tracked)) work;
  };

  // Installed in the waiting coroutine's cancellation slot.
  struct canceller {
    explicit canceller(cross_wait* w) : self(w) {}
    void operator()(asio::cancellation_type) {
      std::lock_guard<std::mutex> g(*self->mutex_);
      if (self->waiter_) std::exchange(self->waiter_, nullptr)->complete(true);
    }
    cross_wait* self;
  };

  std::mutex* mutex_;
  std::unique_ptr<waiter_base> waiter_;
};

}  // namespace blobpipe::detail
