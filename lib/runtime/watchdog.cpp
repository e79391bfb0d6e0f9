#include "lib/runtime/watchdog.hpp"

#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

namespace blobpipe::detail {

watchdog::watchdog(asio::any_io_executor ex, ms stall, ms idle, ms held, now_fn now)
    : timer_(std::move(ex)), clocks_(stall, idle, held), now_(now) {}

asio::awaitable<bool> watchdog::expired() {
  constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);
  while (!clocks_.stopped()) {
    if (enabled()) {
      timer_.expires_after(tick());
    } else {
      timer_.expires_at(asio::steady_timer::time_point::max());
    }
    co_await timer_.async_wait(use_tuple);
    if (check(now_())) co_return true;
  }
  co_return false;
}

void watchdog::stop() noexcept {
  clocks_.stop();
  timer_.cancel();
}

}  // namespace blobpipe::detail
