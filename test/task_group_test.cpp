// lib/runtime/task_group.hpp (internal): tasks with an owner. join() waits
// for every task, cancel() stops the ones that would wait on, on their own
// executors too, a task spawned after cancel() never runs, and a task's
// exception ends that task only.
//
// Coroutine lambdas are named locals of the test body, so their captures
// outlive the coroutines.
#define BOOST_TEST_MODULE task_group_test
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <stdexcept>
#include <thread>

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include "lib/runtime/async_sync.hpp"
#include "lib/runtime/task_group.hpp"

using blobpipe::detail::async_condition;
using blobpipe::detail::pause;
using blobpipe::detail::task_group;
using namespace std::chrono_literals;

namespace {

/// Runs `ctx` until `done` or, as a hang guard (not a timing assertion),
/// 60 s.
template <class Pred>
bool run_until(asio::io_context& ctx, Pred done) {
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (!done() && std::chrono::steady_clock::now() < end) {
    if (ctx.stopped()) ctx.restart();
    ctx.run_one_for(100ms);
  }
  return done();
}

}  // namespace

BOOST_AUTO_TEST_CASE(join_waits_for_every_task_and_completes_at_once_with_none) {
  asio::io_context ctx;
  task_group tasks(ctx.get_executor());
  async_condition go(ctx.get_executor());
  bool opened = false;
  int ended = 0;
  bool joined = false;
  auto waiter = [&]() -> asio::awaitable<void> {
    while (!opened) (void)co_await go.wait();
    ++ended;
  };
  auto joiner = [&]() -> asio::awaitable<void> {
    co_await tasks.join();  // none yet
    BOOST_TEST(tasks.running() == 0u);
    for (int i = 0; i < 3; ++i) tasks.spawn(waiter());
    BOOST_TEST(tasks.running() == 3u);
    co_await tasks.join();
    joined = true;
  };
  asio::co_spawn(ctx, joiner(), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  BOOST_TEST_REQUIRE(run_until(ctx, [&] { return tasks.running() == 3u; }));
  ctx.poll();
  BOOST_TEST(!joined);  // every task still waits
  opened = true;
  go.notify_all();
  BOOST_TEST_REQUIRE(run_until(ctx, [&] { return joined; }));
  BOOST_TEST(ended == 3);
  BOOST_TEST(tasks.failures() == 0u);
}

BOOST_AUTO_TEST_CASE(cancel_stops_waiting_tasks_and_a_later_spawn_never_runs) {
  asio::io_context ctx;
  task_group tasks(ctx.get_executor());
  bool was_cancelled = false;
  bool joined = false;
  bool late_ran = false;
  auto sleeper = [&]() -> asio::awaitable<void> { was_cancelled = co_await pause(1h); };
  auto late = [&]() -> asio::awaitable<void> {
    late_ran = true;
    co_return;
  };
  auto joiner = [&]() -> asio::awaitable<void> {
    co_await tasks.join();
    joined = true;
  };
  tasks.spawn(sleeper());
  asio::co_spawn(ctx, joiner(), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  ctx.poll();
  BOOST_TEST(tasks.running() == 1u);
  tasks.cancel();
  BOOST_TEST(tasks.cancelled());
  BOOST_TEST_REQUIRE(run_until(ctx, [&] { return joined; }));
  BOOST_TEST(was_cancelled);
  tasks.spawn(late());
  ctx.poll();
  BOOST_TEST(!late_ran);
  BOOST_TEST(tasks.running() == 0u);
}

// A task waiting on a condition (or a timed poll of one) and cancelled
// there sees wait() return true and goes on to its own cleanup: the wait
// does not throw operation_aborted out of the task (which Asio's
// throw_if_cancelled default would do at a nested co_await).
BOOST_AUTO_TEST_CASE(a_cancelled_condition_wait_returns_true_without_throwing) {
  asio::io_context ctx;
  task_group tasks(ctx.get_executor());
  async_condition never(ctx.get_executor()), polled(ctx.get_executor());
  int returned_true = 0;
  bool joined = false;
  auto waiter = [&]() -> asio::awaitable<void> {
    const bool cancelled = co_await never.wait();
    if (cancelled) ++returned_true;
  };
  auto poller = [&]() -> asio::awaitable<void> {
    const bool cancelled = co_await polled.wait_for(1h);
    if (cancelled) ++returned_true;
  };
  auto joiner = [&]() -> asio::awaitable<void> {
    co_await tasks.join();
    joined = true;
  };
  tasks.spawn(waiter());
  tasks.spawn(poller());
  asio::co_spawn(ctx, joiner(), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  ctx.poll();
  BOOST_TEST_REQUIRE(tasks.running() == 2u);
  tasks.cancel();
  BOOST_TEST_REQUIRE(run_until(ctx, [&] { return joined; }));
  BOOST_TEST(returned_true == 2);
  BOOST_TEST(tasks.failures() == 0u);  // neither ended by an exception
}

BOOST_AUTO_TEST_CASE(a_task_on_another_thread_is_cancelled_there_and_joined_here) {
  asio::io_context home;
  asio::io_context other;
  auto guard = asio::make_work_guard(other);
  std::thread runner([&] { other.run(); });
  task_group tasks(home.get_executor());
  bool was_cancelled = false;  // written on `other`, read after join
  bool joined = false;
  auto sleeper = [&]() -> asio::awaitable<void> { was_cancelled = co_await pause(1h); };
  tasks.spawn(other.get_executor(), sleeper());
  auto joiner = [&]() -> asio::awaitable<void> {
    co_await tasks.join();
    joined = true;
  };
  asio::co_spawn(home, joiner(), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  home.poll();
  BOOST_TEST(tasks.running() == 1u);
  tasks.cancel();
  BOOST_TEST_REQUIRE(run_until(home, [&] { return joined; }));
  BOOST_TEST(was_cancelled);
  guard.reset();
  runner.join();
}

BOOST_AUTO_TEST_CASE(an_exception_ends_its_task_only_and_is_counted) {
  asio::io_context ctx;
  task_group tasks(ctx.get_executor());
  bool other_ended = false;
  auto failing = []() -> asio::awaitable<void> {
    throw std::runtime_error("task failed");
    co_return;
  };
  auto other = [&]() -> asio::awaitable<void> {
    (void)co_await pause(1ms);
    other_ended = true;
  };
  tasks.spawn(failing());
  tasks.spawn(other());
  BOOST_TEST_REQUIRE(run_until(ctx, [&] { return tasks.running() == 0u; }));
  BOOST_TEST(other_ended);
  BOOST_TEST(tasks.failures() == 1u);
}
