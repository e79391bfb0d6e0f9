// Safe defaults without configuration: a handshake that does not happen
// cannot hold a consumer or a sender. consumer::start and sender::start are
// bounded by handshake_timeout (10 s by default, 0: no limit); past it the
// connection is closed and start() fails with timed_out. The peers here are
// loopback transports whose other end stays silent (it never writes, and
// never reads: a loopback write waits for its reader, so the sender's own
// hello is stuck too).
#define BOOST_TEST_MODULE handshake_timeout
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <string>
#include <system_error>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

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
  std::string reason;
  auto body = [&]() -> asio::awaitable<void> {
    sender_options o;
    o.handshake_timeout = 100ms;
    auto [sec, s] = co_await sender::start(std::move(t), o);
    ec = sec;
    reason = s.failure_reason();
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run(20s));
  BOOST_TEST((ec == errc::timed_out), ec.message());
  BOOST_TEST(!silent->is_open());
  // The failed sender says which limit ended it.
  BOOST_TEST(reason.find("no handshake with the consumer") != std::string::npos, reason);
  BOOST_TEST(reason.find("(handshake_timeout)") != std::string::npos, reason);
}

namespace {

using connect_result = std::tuple<std::error_code, std::unique_ptr<transport>>;

/// A resend session's connections to consumers that never answer (never
/// read, never write); `ends` keeps their silent ends, `connects` counts.
struct silent_consumers {
  runner& r;
  std::vector<std::unique_ptr<transport>> ends{};
  int connects = 0;
  connect_fn connect() {
    return [this]() -> asio::awaitable<connect_result> {
      ++connects;
      auto [silent, t] = loopback::make_pair(r.ex());
      ends.push_back(std::move(silent));
      co_return connect_result{std::error_code{}, std::move(t)};
    };
  }
};

/// A resend session's options: `attempts` attempts 1 ms apart, each
/// bounded by `handshake` (handshake_timeout) and `stall` (stall_timeout).
sender_options resend_bounded(std::chrono::milliseconds handshake,
                              std::chrono::milliseconds stall, std::uint32_t attempts) {
  sender_options o;
  o.handshake_timeout = handshake;
  o.stall_timeout = stall;
  o.resend.max_attempts = attempts;
  o.resend.retry_delay = 1ms;
  return o;
}

/// What sender::start(connect, o) of a resend session returns, run to its
/// end (within the runner's 20 s hang guard); `reason`, when given, gets
/// the failed sender's failure_reason().
std::error_code resend_start_error(runner& r, const connect_fn& connect,
                                   const sender_options& o, std::string* reason = nullptr) {
  std::error_code ec;
  auto body = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await sender::start(connect, o);
    ec = sec;
    if (reason) *reason = s.failure_reason();
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run(20s));
  return ec;
}

/// A resend session against consumers that never answer, with options
/// `o`: start() gives up with timed_out after max_attempts connections,
/// each closed at the limit.
void expect_attempts_time_out(const sender_options& o) {
  runner r;
  silent_consumers peers{r};
  std::string reason;
  const auto ec = resend_start_error(r, peers.connect(), o, &reason);
  BOOST_TEST((ec == errc::timed_out), ec.message());
  BOOST_TEST(peers.connects == static_cast<int>(o.resend.max_attempts));
  for (const auto& end : peers.ends) BOOST_TEST(!end->is_open());
  // The failed sender names the attempts, their limit and the hint.
  const std::string attempts = std::to_string(o.resend.max_attempts);
  BOOST_TEST(reason.find("no handshake with the consumer on " + attempts +
                         " connection attempts in a row (max_attempts " + attempts + ")") !=
                 std::string::npos,
             reason);
  BOOST_TEST(reason.find("is the consumer listening and accepting?") != std::string::npos, reason);
}

/// Once `end` holds the consumer's end of the sender's first connection,
/// starts a consumer on it (delivery log `log`) and closes it at once: the
/// session loses its connection with nothing kept.
asio::awaitable<void> consume_then_leave(std::unique_ptr<transport>& end,
                                         std::shared_ptr<delivery_log> log) {
  consumer_options o;
  o.delivered = std::move(log);
  while (!end) co_await yield_n(1);
  auto [ec, c] = co_await consumer::start(std::move(end), o);
  BOOST_TEST_REQUIRE(!ec, ec.message());
  c.close();
}

}  // namespace

// A resend session's attempts are each bounded: connections to a consumer
// that never answers fail one after another, then start() gives up.
BOOST_AUTO_TEST_CASE(resend_session_gives_up_on_consumers_that_say_nothing) {
  expect_attempts_time_out(resend_bounded(50ms, 0ms, 3));
}

// stall_timeout bounds a resend session's whole attempt (lib/pipeline/
// deadline.hpp): a connect function that never completes is cancelled at
// the limit, and the attempt fails with timed_out like a handshake that
// never ends.
BOOST_AUTO_TEST_CASE(resend_stall_timeout_cancels_a_connect_that_never_completes) {
  runner r;
  int connects = 0;
  int cancelled = 0;
  connect_fn connect = [&]() -> asio::awaitable<connect_result> {
    ++connects;
    asio::steady_timer never(r.ex(), std::chrono::hours(1));
    auto [wec] = co_await never.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (wec == asio::error::operation_aborted) ++cancelled;
    co_return connect_result{wec ? wec : make_error_code(errc::peer_failed), nullptr};
  };
  const auto ec = resend_start_error(r, connect, resend_bounded(0ms, 50ms, 2));
  BOOST_TEST((ec == errc::timed_out), ec.message());
  BOOST_TEST(connects == 2);
  BOOST_TEST(cancelled == 2);
}

// Without a stall_timeout, the caller's cancellation of sender::start
// reaches a connect function that never completes (Python's connect()
// relies on it for Ctrl-C): start() ends with operation_aborted.
BOOST_AUTO_TEST_CASE(cancelling_start_cancels_a_resend_connect_that_never_completes) {
  runner r;
  int cancelled = 0;
  connect_fn connect = [&]() -> asio::awaitable<connect_result> {
    asio::steady_timer never(r.ex(), std::chrono::hours(1));
    auto [wec] = co_await never.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (wec == asio::error::operation_aborted) ++cancelled;
    co_return connect_result{wec ? wec : make_error_code(errc::peer_failed), nullptr};
  };
  const auto o = resend_bounded(0ms, 0ms, 3);
  asio::cancellation_signal stop;
  std::error_code ec;
  bool ended = false;
  auto body = [&]() -> asio::awaitable<void> {
    try {
      auto [sec, s] = co_await sender::start(connect, o);
      ec = sec;
    } catch (const std::system_error& e) {  // the cancellation, thrown at an await
      ec = e.code();
    }
    ended = true;
  };
  asio::co_spawn(r.ex(), body(), asio::bind_cancellation_slot(stop.slot(), asio::detached));
  asio::steady_timer soon(r.ex(), 20ms);
  soon.async_wait([&](std::error_code) { stop.emit(asio::cancellation_type::all); });
  BOOST_TEST_REQUIRE(r.run(20s));  // a hang guard: without the forwarding it waits an hour
  BOOST_TEST(ended);
  BOOST_TEST(cancelled == 1);
  BOOST_TEST(static_cast<bool>(ec), ec.message());
}

// ... and a handshake with a consumer that never answers is ended at it
// too, with no handshake_timeout of its own: the attempt's link is closed.
BOOST_AUTO_TEST_CASE(resend_stall_timeout_closes_a_handshake_that_never_ends) {
  expect_attempts_time_out(resend_bounded(0ms, 50ms, 2));
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

// What a resend session says it will try: max_attempts handshake bounds
// plus the waits between them, as connect_loop runs them. A bound of the
// waits alone would say "about 5 s" of a session that tries for 96.6 s.
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
  o.resend.retry_delay = 80ms;  // above max_retry_delay: each wait is that
  o.resend.max_retry_delay = 20ms;
  BOOST_TEST(resend_give_up_bound(o).count() == 190);  // 3 x 50 + 2 x 20
  o.handshake_timeout = 0ms;
  o.stall_timeout = 0ms;
  BOOST_TEST(resend_give_up_bound(o).count() == 0);  // no bound at all
}

// shutdown() of a resend session joins its tasks, a connection attempt in
// flight included: with no handshake_timeout and no stall_timeout, an
// attempt whose consumer never answers would wait for ever; shutdown (all
// delivered, no connection) ends it by closing its link and returns with
// no task of the sender running.
BOOST_AUTO_TEST_CASE(resend_shutdown_ends_a_connection_attempt_in_flight) {
  runner r;
  silent_consumers silent{r};
  auto log = std::make_shared<delivery_log>();
  std::unique_ptr<transport> first_consumer_end;
  int connects = 0;
  const connect_fn to_silent = silent.connect();
  connect_fn connect = [&]() -> asio::awaitable<connect_result> {
    if (++connects > 1) co_return co_await to_silent();
    auto [t, b] = loopback::make_pair(r.ex());
    first_consumer_end = std::move(b);
    co_return connect_result{std::error_code{}, std::move(t)};
  };
  std::error_code shut;
  std::uint64_t running_after = 1;
  auto produce = [&]() -> asio::awaitable<void> {
    sender_options o = resend_bounded(0ms, 0ms, 3);
    auto [sec, s] = co_await sender::start(connect, o);
    BOOST_TEST_REQUIRE(!sec, sec.message());
    for (int i = 0; i < 100000 && silent.connects == 0; ++i) co_await yield_n(1);
    BOOST_TEST_REQUIRE(silent.connects == 1);
    co_await yield_n(100);  // the second attempt is in its handshake, waiting for ever
    shut = co_await s.shutdown();
    running_after = s.stats().tasks_running;
  };
  r.spawn(consume_then_leave(first_consumer_end, log));
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run(20s));  // a hang guard: without the end, shutdown waits for ever
  BOOST_TEST(!shut, shut.message());
  BOOST_TEST(running_after == 0u, "a task of the sender outlived shutdown()");
  for (const auto& end : silent.ends) BOOST_TEST(!end->is_open());
}

// A connect function that ignores its cancellation cannot hold shutdown()
// for as long as it runs: the wait for the sender's tasks is bounded by
// handshake_timeout, past which shutdown returns timed_out and names the
// limit (the connect runs on, and ends on its own later).
BOOST_AUTO_TEST_CASE(resend_shutdown_bounds_its_wait_for_a_connect_that_ignores_cancellation) {
  runner r;
  auto log = std::make_shared<delivery_log>();
  std::unique_ptr<transport> first_consumer_end;
  int connects = 0;
  bool stubborn_ended = false;
  gate stubborn_done(r.ex());
  connect_fn connect = [&]() -> asio::awaitable<connect_result> {
    if (++connects > 1) {
      // Ignores the cancellation shutdown sends, for 2 s.
      co_await asio::this_coro::reset_cancellation_state(asio::disable_cancellation());
      asio::steady_timer stubborn(r.ex(), 2s);
      (void)co_await stubborn.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
      stubborn_ended = true;
      stubborn_done.open();
      co_return connect_result{make_error_code(errc::peer_failed), nullptr};
    }
    auto [t, b] = loopback::make_pair(r.ex());
    first_consumer_end = std::move(b);
    co_return connect_result{std::error_code{}, std::move(t)};
  };
  std::error_code shut;
  std::string why;
  bool connect_still_running = false;
  std::uint64_t running_at_shutdown = 0;
  std::uint64_t running_later = 1;
  auto produce = [&]() -> asio::awaitable<void> {
    sender_options o = resend_bounded(100ms, 0ms, 3);
    auto [sec, s] = co_await sender::start(connect, o);
    BOOST_TEST_REQUIRE(!sec, sec.message());
    for (int i = 0; i < 100000 && connects < 2; ++i) co_await yield_n(1);
    BOOST_TEST_REQUIRE(connects == 2);
    shut = co_await s.shutdown();
    why = s.failure_reason();
    connect_still_running = !stubborn_ended;
    running_at_shutdown = s.stats().tasks_running;
    // The connect ends on its own, and with it the sender's last task.
    co_await stubborn_done.wait();
    co_await yield_n(10);
    running_later = s.stats().tasks_running;
  };
  r.spawn(consume_then_leave(first_consumer_end, log));
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run(20s));
  BOOST_TEST((shut == errc::timed_out), shut.message());
  BOOST_TEST(why.find("(handshake_timeout)") != std::string::npos, why);
  BOOST_TEST(connect_still_running, "shutdown waited for the stubborn connect");
  BOOST_TEST(running_at_shutdown >= 1u);
  BOOST_TEST(running_later == 0u);
}
