// lib/runtime/deadline.hpp (internal): the one idiom for a bounded wait.
// Its expiry action runs once, after the limit; going out of scope
// disarms it, also when the timer has fired and its handler has not run
// yet; a limit of 0 is no bound. Nothing here asserts how long anything
// took: each case runs the io_context until it has no work left and
// checks whether the action ran.
#define BOOST_TEST_MODULE deadline_test
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>

#include "lib/runtime/deadline.hpp"

using blobpipe::detail::deadline;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(expiry_runs_the_action_once_and_says_so) {
  asio::io_context io;
  int ran = 0;
  deadline d(io.get_executor(), 1ms, [&] { ++ran; });
  BOOST_TEST(!d.expired());
  io.run();  // until the timer's handler has run: no work is left then
  BOOST_TEST(ran == 1);
  BOOST_TEST(d.expired());
  io.restart();
  io.run();  // nothing more to run: once only
  BOOST_TEST(ran == 1);
  BOOST_TEST(d.limit().count() == 1);
  BOOST_TEST(d.reason("no handshake with the sender", "handshake_timeout") ==
             "no handshake with the sender within 1 ms (handshake_timeout)");
}

BOOST_AUTO_TEST_CASE(scope_exit_disarms_it_before_the_limit) {
  asio::io_context io;
  int ran = 0;
  // A short limit, so that a deadline that failed to disarm would fire in
  // the run below (not in an hour).
  { deadline d(io.get_executor(), 1ms, [&] { ++ran; }); }
  io.run();  // the cancelled wait completes
  BOOST_TEST(ran == 0);
}

BOOST_AUTO_TEST_CASE(scope_exit_disarms_it_after_the_timer_fired_and_before_its_handler) {
  asio::io_context io;
  auto strand = asio::make_strand(io);
  std::atomic<int> ran = 0;
  auto d = std::make_unique<deadline>(strand, 1ms, [&] { ++ran; });
  asio::post(strand, [&] {
    // Holds the strand past the limit, so that the other thread sees the
    // timer fire and queues its handler behind this one; then the scope
    // ends. (On a machine too busy for that, the scope ends first and
    // cancels the wait: the assertion below holds the same.)
    std::this_thread::sleep_for(50ms);
    d.reset();
  });
  std::thread other([&] { io.run(); });
  io.run();
  other.join();
  BOOST_TEST(ran == 0);
}

BOOST_AUTO_TEST_CASE(limit_zero_is_no_bound) {
  asio::io_context io;
  int ran = 0;
  deadline none(io.get_executor(), 0ms, [&] { ++ran; });
  deadline below(io.get_executor(), -5ms, [&] { ++ran; });
  io.run();  // no timer armed: returns at once
  BOOST_TEST(ran == 0);
  BOOST_TEST(!none.expired());
  BOOST_TEST(!below.expired());
}
