// lib/runtime/async_sync.hpp (internal): async_mutex. A free mutex is
// taken at once; unlock() frees it when nobody waits and otherwise hands
// it to the longest waiter (it stays locked meanwhile); close() fails
// every waiter and every later lock() with closed.
//
// Coroutine lambdas are named locals of the test body, so their captures
// outlive the coroutines.
#define BOOST_TEST_MODULE async_mutex_test
#include <boost/test/unit_test.hpp>

#include <system_error>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/errors.hpp"
#include "lib/runtime/async_sync.hpp"

using blobpipe::errc;
using blobpipe::detail::async_mutex;

BOOST_AUTO_TEST_CASE(unlock_with_nobody_waiting_frees_the_mutex) {
  asio::io_context ctx;
  async_mutex m(ctx.get_executor());
  BOOST_TEST(m.try_lock());
  BOOST_TEST(!m.try_lock());
  m.unlock();
  BOOST_TEST(m.try_lock());
  m.unlock();
  bool locked = false;
  auto locker = [&]() -> asio::awaitable<void> {
    locked = !co_await m.lock();
    m.unlock();
  };
  asio::co_spawn(ctx, locker(), asio::detached);
  // poll, not run: a lock that waits must fail the case, not hang it.
  ctx.poll();
  BOOST_TEST(locked);
  BOOST_TEST(m.try_lock());
}

BOOST_AUTO_TEST_CASE(unlock_hands_the_mutex_to_the_longest_waiter_first) {
  asio::io_context ctx;
  async_mutex m(ctx.get_executor());
  BOOST_REQUIRE(m.try_lock());
  std::vector<int> order;
  auto waiter = [&](int id) -> asio::awaitable<void> {
    auto ec = co_await m.lock();
    BOOST_TEST(!ec);
    order.push_back(id);
  };
  asio::co_spawn(ctx, waiter(1), asio::detached);
  asio::co_spawn(ctx, waiter(2), asio::detached);
  ctx.poll();  // both are waiting now
  BOOST_TEST(order.empty());
  m.unlock();
  ctx.restart();
  ctx.poll();
  BOOST_TEST(order == std::vector<int>({1}));
  // Handed over, never free in between: a try_lock cannot jump the queue.
  BOOST_TEST(!m.try_lock());
  m.unlock();
  ctx.restart();
  ctx.poll();
  BOOST_TEST(order == std::vector<int>({1, 2}));
  BOOST_TEST(!m.try_lock());
  m.unlock();
  BOOST_TEST(m.try_lock());
}

BOOST_AUTO_TEST_CASE(close_fails_the_waiters_and_later_locks_with_closed) {
  asio::io_context ctx;
  async_mutex m(ctx.get_executor());
  BOOST_REQUIRE(m.try_lock());
  std::vector<std::error_code> got;
  auto locker = [&]() -> asio::awaitable<void> { got.push_back(co_await m.lock()); };
  asio::co_spawn(ctx, locker(), asio::detached);
  ctx.poll();
  BOOST_TEST(got.empty());
  m.close();
  ctx.restart();
  ctx.poll();
  asio::co_spawn(ctx, locker(), asio::detached);
  ctx.restart();
  ctx.poll();
  BOOST_REQUIRE(got.size() == 2u);
  BOOST_TEST((got[0] == make_error_code(errc::closed)));
  BOOST_TEST((got[1] == make_error_code(errc::closed)));
  BOOST_TEST(!m.try_lock());
}
