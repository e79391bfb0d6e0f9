// Safe defaults without configuration (issue 17): a handshake that does not
// happen cannot hold a consumer or a sender. consumer::start and
// sender::start are bounded by handshake_timeout (10 s by default, 0: no
// limit); past it the connection is closed and start() fails with
// timed_out. The peers here are loopback transports whose other end stays
// silent (it never writes, and never reads: a loopback write waits for its
// reader, so the sender's own hello is stuck too).
#define BOOST_TEST_MODULE handshake_timeout
#include <boost/test/unit_test.hpp>

#include <chrono>

#include "blobpipe/transport/loopback.hpp"
#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(handshakes_are_bounded_by_default) {
  BOOST_TEST(consumer_options{}.handshake_timeout.count() == 10'000);
  BOOST_TEST(sender_options{}.handshake_timeout.count() == 10'000);
  // Off by default, and why: consumer.hpp (a quiet producer is healthy).
  BOOST_TEST(consumer_options{}.idle_timeout.count() == 0);
}

BOOST_AUTO_TEST_CASE(consumer_start_times_out_on_a_sender_that_says_nothing) {
  runner r;
  auto [silent, t] = loopback::make_pair(r.ex());
  std::error_code ec;
  bool silent_end_closed = false;
  auto body = [&]() -> asio::awaitable<void> {
    consumer_options o;
    o.handshake_timeout = 100ms;
    auto [sec, c] = co_await consumer::start(std::move(t), o);
    ec = sec;
    // The connection was closed: the silent end sees it.
    std::array<std::byte, 64> buf;
    auto [rec, got] = co_await silent->read_some(buf);
    silent_end_closed = rec == errc::peer_closed;
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run(20s));
  BOOST_TEST((ec == errc::timed_out), ec.message());
  BOOST_TEST(silent_end_closed);
}

BOOST_AUTO_TEST_CASE(sender_start_times_out_on_a_consumer_that_says_nothing) {
  runner r;
  auto [silent, t] = loopback::make_pair(r.ex());
  std::error_code ec;
  auto body = [&]() -> asio::awaitable<void> {
    sender_options o;
    o.handshake_timeout = 100ms;
    auto [sec, s] = co_await sender::start(std::move(t), o);
    ec = sec;
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run(20s));
  BOOST_TEST((ec == errc::timed_out), ec.message());
  BOOST_TEST(!silent->is_open());
}

// A resend session's attempts are each bounded: connections to a consumer
// that never answers fail one after another, then start() gives up.
BOOST_AUTO_TEST_CASE(resend_session_gives_up_on_consumers_that_say_nothing) {
  runner r;
  std::vector<std::unique_ptr<transport>> silent_ends;
  int connects = 0;
  connect_fn connect = [&]() -> asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> {
    ++connects;
    auto [silent, t] = loopback::make_pair(r.ex());
    silent_ends.push_back(std::move(silent));
    co_return std::tuple{std::error_code{}, std::move(t)};
  };
  std::error_code ec;
  auto body = [&]() -> asio::awaitable<void> {
    sender_options o;
    o.handshake_timeout = 50ms;
    o.resend.max_attempts = 3;
    o.resend.retry_delay = 1ms;
    auto [sec, s] = co_await sender::start(connect, o);
    ec = sec;
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run(20s));
  BOOST_TEST((ec == errc::timed_out), ec.message());
  BOOST_TEST(connects == 3);
}

// 0 turns the bound off: a hello that comes late (after what a short bound
// would allow) still completes the handshake.
BOOST_AUTO_TEST_CASE(zero_handshake_timeout_waits_for_a_late_hello) {
  runner r;
  auto [a, b] = loopback::make_pair(r.ex());
  std::error_code cec, sec;
  auto consume = [&]() -> asio::awaitable<void> {
    consumer_options o;
    o.handshake_timeout = 0ms;
    auto [ec, c] = co_await consumer::start(std::move(b), o);
    cec = ec;
  };
  auto send_late = [&]() -> asio::awaitable<void> {
    asio::steady_timer late(r.ex(), 300ms);
    co_await late.async_wait(asio::use_awaitable);
    auto [ec, s] = co_await sender::start(std::move(a));
    sec = ec;
  };
  r.spawn(consume());
  r.spawn(send_late());
  BOOST_TEST_REQUIRE(r.run(20s));
  BOOST_TEST(!cec, cec.message());
  BOOST_TEST(!sec, sec.message());
}

// What a resend session says it will try (issue 26: the rollout workers
// said "about 5 s" and tried for 96.6 s): max_attempts handshake bounds
// plus the waits between them, as connect_loop runs them.
BOOST_AUTO_TEST_CASE(resend_give_up_bound_counts_every_attempt_and_wait) {
  sender_options o;
  o.resend.max_attempts = 10;
  o.resend.retry_delay = 100ms;
  o.resend.max_retry_delay = 1000ms;
  // 10 x 10 s, then 100 + 200 + 400 + 800 + 5 x 1000 ms of waits.
  BOOST_TEST(resend_give_up_bound(o).count() == 106'500);
  o.stall_timeout = 2s;  // shorter: it bounds each attempt
  BOOST_TEST(resend_give_up_bound(o).count() == 26'500);
  o.stall_timeout = 60s;  // longer: the handshake bound still holds
  BOOST_TEST(resend_give_up_bound(o).count() == 106'500);
  o.resend.max_attempts = 3;
  o.resend.retry_delay = 1ms;
  o.handshake_timeout = 50ms;
  BOOST_TEST(resend_give_up_bound(o).count() == 153);  // the session below
  o.handshake_timeout = 0ms;
  o.stall_timeout = 0ms;
  BOOST_TEST(resend_give_up_bound(o).count() == 0);  // no bound at all
}
