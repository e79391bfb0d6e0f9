// lib/runtime/watchdog.hpp (internal): each limit of the stall watchdog
// driven with a clock of the test's own, one check(now) at a time, so no
// case depends on the machine's speed: idle, stall (measured in progress,
// owed only), pressed, held, the consumer's handshake wait (the hello
// owed from the start), the stall clock that starts when the peer begins
// to owe, the time not waiting left out, and expired()'s loop.
#define BOOST_TEST_MODULE watchdog_test
#include <boost/test/unit_test.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "lib/runtime/watchdog.hpp"

using blobpipe::detail::watchdog;
using ms = std::chrono::milliseconds;
using kind = watchdog::limit_kind;

namespace {

// The test's clock: moved only by the test.
watchdog::clock::time_point fake_now = watchdog::clock::time_point{} + std::chrono::hours(1);
watchdog::clock::time_point fake() noexcept { return fake_now; }
void advance(ms d) { fake_now += d; }

/// A watchdog on the test's clock (its timer is never run here).
struct dog {
  asio::io_context io;
  watchdog w;
  dog(ms stall, ms idle, ms held = ms(0)) : w(io.get_executor(), stall, idle, held, &fake) {}
  std::optional<kind> check() { return w.check(fake_now); }
};

bool none(const std::optional<kind>& k) { return !k.has_value(); }

}  // namespace

BOOST_AUTO_TEST_CASE(a_silent_wait_trips_idle_at_its_limit_and_any_byte_restarts_it) {
  dog d(ms(0), ms(100));
  d.w.begin_wait();
  advance(ms(99));
  BOOST_TEST(none(d.check()));
  d.w.progress(1, 0);  // one byte ends a silence
  advance(ms(99));
  BOOST_TEST(none(d.check()));
  advance(ms(1));
  const auto k = d.check();
  BOOST_TEST_REQUIRE(k.has_value());
  BOOST_TEST((*k == kind::idle));
  BOOST_TEST((d.w.tripped() == kind::idle));
  BOOST_TEST(std::string(d.w.tripped_name()) == "idle");
  BOOST_TEST(d.w.limit().count() == 100);
}

BOOST_AUTO_TEST_CASE(nothing_trips_while_no_wait_is_open_nor_after_stop) {
  dog d(ms(100), ms(100), ms(100));
  d.w.owes(true);
  d.w.held(true);
  advance(ms(1000));
  BOOST_TEST(none(d.check()));  // never waited
  d.w.begin_wait();
  d.w.end_wait();
  advance(ms(1000));
  BOOST_TEST(none(d.check()));  // the wait ended
  d.w.begin_wait();
  advance(ms(1000));
  d.w.stop();
  BOOST_TEST(none(d.check()));
}

BOOST_AUTO_TEST_CASE(limits_of_zero_are_off) {
  dog d(ms(0), ms(0), ms(0));
  BOOST_TEST(!d.w.enabled());
  d.w.owes(true);
  d.w.held(true);
  d.w.begin_wait();
  advance(std::chrono::hours(24));
  BOOST_TEST(none(d.check()));
}

BOOST_AUTO_TEST_CASE(the_tick_is_a_quarter_of_the_shortest_limit) {
  BOOST_TEST(dog(ms(400), ms(0)).w.tick().count() == 100);
  BOOST_TEST(dog(ms(400), ms(200), ms(1000)).w.tick().count() == 50);
  BOOST_TEST(dog(ms(0), ms(0), ms(40)).w.tick().count() == 10);
  BOOST_TEST(dog(ms(2), ms(0)).w.tick().count() == 1);  // at least 1 ms
}

BOOST_AUTO_TEST_CASE(a_stall_trips_only_while_the_peer_owes_bytes) {
  dog d(ms(100), ms(0));
  d.w.begin_wait();
  advance(ms(500));
  BOOST_TEST(none(d.check()));  // owes nothing: waiting is not stalling
  d.w.owes(true);
  advance(ms(99));
  BOOST_TEST(none(d.check()));
  advance(ms(1));
  const auto k = d.check();
  BOOST_TEST_REQUIRE(k.has_value());
  BOOST_TEST((*k == kind::stall));
  BOOST_TEST(std::string(d.w.tripped_name()) == "stall");
  BOOST_TEST(d.w.limit().count() == 100);
}

// The rule of docs/reliability.md "Held entries": a sender that waited for
// credit the application held (owing nothing) and then begins to owe has
// the whole stall limit from then, not what is left of it since the wait
// began (the progress clock counted the wait, so the first tick after the
// release tripped: server_test under ASan).
BOOST_AUTO_TEST_CASE(the_stall_clock_starts_when_the_peer_begins_to_owe) {
  dog d(ms(100), ms(0));
  d.w.progress(0, 0);  // a receiver's counted progress, as the consumer's
  d.w.begin_wait();
  advance(ms(1000));  // waiting for credit the application held
  d.w.owes(true);     // released: the sender owes its next frame
  advance(ms(99));
  BOOST_TEST(none(d.check()), "the time before it owed was counted as a stall");
  advance(ms(1));
  BOOST_TEST((d.check() == kind::stall));
  // Owing again after it stopped owing restarts the clock; owing on
  // (owes(true) repeated) does not.
  dog e(ms(100), ms(0));
  e.w.begin_wait();
  e.w.owes(true);
  advance(ms(60));
  e.w.owes(true);
  advance(ms(40));
  BOOST_TEST((e.check() == kind::stall));
}

BOOST_AUTO_TEST_CASE(a_stall_is_measured_in_progress_so_a_trickle_trips_it) {
  dog d(ms(100), ms(100));
  d.w.owes(true);
  d.w.begin_wait();
  std::uint64_t bytes = 0;
  for (int i = 0; i < 9; ++i) {  // one byte every 11 ms: never idle
    advance(ms(11));
    d.w.progress(++bytes, 0);
    BOOST_TEST(none(d.check()));
  }
  advance(ms(1));
  BOOST_TEST((d.check() == kind::stall));
  // An item ended, or progress_bytes more bytes, is progress.
  dog e(ms(100), ms(0));
  e.w.owes(true);
  e.w.begin_wait();
  advance(ms(90));
  e.w.progress(10, 1);  // an entry ended
  advance(ms(90));
  BOOST_TEST(none(e.check()));
  e.w.progress(10 + watchdog::progress_bytes, 1);  // 1 MiB more
  advance(ms(90));
  BOOST_TEST(none(e.check()));
  e.w.progress(10 + watchdog::progress_bytes + watchdog::progress_bytes - 1, 1);
  advance(ms(10));
  BOOST_TEST((e.check() == kind::stall));  // one byte short of 1 MiB: no progress
}

BOOST_AUTO_TEST_CASE(time_spent_not_waiting_is_not_the_peers_stall) {
  dog d(ms(100), ms(0));
  d.w.owes(true);
  d.w.progress(0, 0);
  d.w.begin_wait();
  advance(ms(60));
  d.w.end_wait();
  advance(ms(1000));  // the application was busy: not waiting on the peer
  d.w.begin_wait();
  advance(ms(39));
  BOOST_TEST(none(d.check()));  // 99 ms of waiting
  advance(ms(1));
  BOOST_TEST((d.check() == kind::stall));
}

// The consumer's handshake: the hello is owed from the start
// (consumer.cpp), so a peer that connects and says nothing stalls, and
// one that trickles the hello stalls too, though it is never idle.
BOOST_AUTO_TEST_CASE(the_handshake_owes_the_hello_from_the_start) {
  dog d(ms(100), ms(1000));
  d.w.owes(true);
  d.w.begin_wait();
  advance(ms(99));
  BOOST_TEST(none(d.check()));
  advance(ms(1));
  BOOST_TEST((d.check() == kind::stall));

  dog e(ms(100), ms(1000));
  e.w.owes(true);
  e.w.begin_wait();
  for (std::uint64_t b = 1; b <= 5; ++b) {
    advance(ms(20));
    e.w.progress(b, 0);
  }
  BOOST_TEST((e.check() == kind::stall));
}

BOOST_AUTO_TEST_CASE(pressed_trips_after_the_stall_limit_of_pressure_without_progress) {
  bool pressed = false;
  dog d(ms(100), ms(0));
  d.w.pressure([&] { return pressed; });
  d.w.begin_wait();
  advance(ms(500));
  BOOST_TEST(none(d.check()));  // owes nothing, not pressed
  pressed = true;
  BOOST_TEST(none(d.check()));  // pressure seen: its clock starts now
  advance(ms(99));
  BOOST_TEST(none(d.check()));
  d.w.progress(1, 1);  // progress restarts it
  advance(ms(50));
  BOOST_TEST(none(d.check()));
  pressed = false;  // relieved: the count pauses at 50 ms
  advance(ms(10));
  BOOST_TEST(none(d.check()));
  advance(ms(200));
  BOOST_TEST(none(d.check()));
  pressed = true;  // pressed again: counted on from 50 ms
  BOOST_TEST(none(d.check()));
  advance(ms(49));
  BOOST_TEST(none(d.check()));
  advance(ms(1));
  BOOST_TEST((d.check() == kind::pressed));
  BOOST_TEST(d.w.limit().count() == 100);  // the stall limit
  // No stall limit: no pressure either.
  dog e(ms(0), ms(0), ms(50));
  e.w.pressure([] { return true; });
  e.w.begin_wait();
  advance(ms(1000));
  BOOST_TEST(none(e.check()));
}

// A holder of credit others wait for cannot reset its clock by letting
// the pressure lapse (a waiting sender that gives up and reconnects), nor
// by sending what is not progress (blob_begin + blob_abort pairs: the
// consumer counts neither bytes nor an item for them).
BOOST_AUTO_TEST_CASE(pressure_that_comes_and_goes_adds_up_until_progress) {
  bool pressed = false;
  dog d(ms(100), ms(0));
  d.w.pressure([&] { return pressed; });
  d.w.begin_wait();
  for (int round = 0; round < 4; ++round) {  // 30 ms pressed, 500 ms not, each round
    pressed = true;
    BOOST_TEST(none(d.check()));
    advance(ms(30));
    d.w.progress(0, 0);  // a control frame arrived: no bytes admitted, no item
    if (round < 3) {
      BOOST_TEST(none(d.check()));
    } else {
      BOOST_TEST((d.check() == kind::pressed));  // 120 ms pressed in all
      break;
    }
    pressed = false;
    BOOST_TEST(none(d.check()));
    advance(ms(500));
  }
  // Time not waiting is not pressure: the count stops with the wait. (A
  // consumer marks its progress in bytes and items, as here.)
  dog e(ms(100), ms(0));
  e.w.pressure([] { return true; });
  e.w.progress(0, 0);
  e.w.begin_wait();
  BOOST_TEST(none(e.check()));
  advance(ms(90));
  BOOST_TEST(none(e.check()));
  e.w.end_wait();
  BOOST_TEST(none(e.check()));
  advance(ms(1000));
  e.w.begin_wait();
  BOOST_TEST(none(e.check()));
  advance(ms(9));
  BOOST_TEST(none(e.check()));
  advance(ms(1));
  BOOST_TEST((e.check() == kind::pressed));
}

BOOST_AUTO_TEST_CASE(held_trips_when_silent_for_its_limit_since_the_holding_began) {
  dog d(ms(0), ms(0), ms(100));
  d.w.begin_wait();
  advance(ms(500));
  BOOST_TEST(none(d.check()));  // nothing held
  d.w.held(true);
  advance(ms(99));
  BOOST_TEST(none(d.check()));
  d.w.progress(1, 0);  // a byte arrived: silence starts over
  advance(ms(99));
  BOOST_TEST(none(d.check()));
  d.w.held(true);  // still held: the clock goes on
  advance(ms(1));
  BOOST_TEST((d.check() == kind::held));
  BOOST_TEST(std::string(d.w.tripped_name()) == "held");
  BOOST_TEST(d.w.limit().count() == 100);
  // Released in time: nothing trips.
  dog e(ms(0), ms(0), ms(100));
  e.w.begin_wait();
  e.w.held(true);
  advance(ms(99));
  e.w.held(false);
  advance(ms(1000));
  BOOST_TEST(none(e.check()));
}

BOOST_AUTO_TEST_CASE(idle_is_checked_before_stall) {
  dog d(ms(100), ms(100));
  d.w.owes(true);
  d.w.begin_wait();
  advance(ms(100));
  BOOST_TEST((d.check() == kind::idle));
}

// The loop: expired() sleeps a tick of real time and checks the test's
// clock; stop() ends it with false.
BOOST_AUTO_TEST_CASE(expired_completes_with_the_first_limit_exceeded_or_false_after_stop) {
  asio::io_context io;
  watchdog w(io.get_executor(), ms(4), ms(0), ms(0), &fake);
  w.owes(true);
  w.begin_wait();
  advance(ms(4));
  std::optional<bool> got;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> { got = co_await w.expired(); },
                 asio::detached);
  io.run();
  BOOST_TEST_REQUIRE(got.has_value());
  BOOST_TEST(*got);
  BOOST_TEST((w.tripped() == kind::stall));

  asio::io_context io2;
  watchdog v(io2.get_executor(), ms(4), ms(0), ms(0), &fake);
  v.begin_wait();  // owes nothing: never trips
  std::optional<bool> got2;
  asio::co_spawn(io2, [&]() -> asio::awaitable<void> { got2 = co_await v.expired(); },
                 asio::detached);
  for (int i = 0; i < 3; ++i) io2.run_one();  // the coroutine starts; two ticks pass
  BOOST_TEST(!got2.has_value());
  v.stop();
  io2.run();
  BOOST_TEST_REQUIRE(got2.has_value());
  BOOST_TEST(!*got2);
}
