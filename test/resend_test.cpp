// Resend sessions and de-duplication (blobpipe/pipeline/producer.hpp "Resend
// sessions", blobpipe/pipeline/delivery.hpp; docs/reliability.md): every blob a
// producer ends reaches the application exactly once and byte-identical,
// however often the connection dies, and the sender's memory stays within
// its budget.
//
// BLOBPIPE_LONG=1 (the manual target resend_long_test) runs the soak-sized
// variant: 200,000 blobs and 200 connection kills.
#define BOOST_TEST_MODULE resend
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include "test/fault_proxy.hpp"
#include "test/reliability_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

const link_kind both[] = {link_kind::loopback, link_kind::tcp};

// Under ASan or TSan every operation costs several times more; the
// sanitizer phases look for memory and thread errors, for which a shorter
// stream is as good, so they keep each test binary under 30 s.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif

bool long_run() {
  const char* v = std::getenv("BLOBPIPE_LONG");
  return v != nullptr && *v != '\0' && *v != '0';
}

session_id session_of(int n) {
  session_id s{};
  s[0] = std::byte{static_cast<unsigned char>(n)};
  s[1] = std::byte{0x5e};
  return s;
}

/// Starts a resend session over `l` (the consumer side must be served).
asio::awaitable<sender> start_resend(reconnect_link& l, sender_options opt) {
  auto [ec, s] = co_await sender::start(l.connector(), opt);
  if (ec) throw std::runtime_error("resend start: " + ec.message());
  co_return std::move(s);
}

sender_options fast_retry(std::uint64_t budget = 1u << 20) {
  sender_options o;
  o.chunk_bytes = 256;  // several data frames per entry: kills land mid-entry
  o.inline_bytes = 16;  // "b" inline, "a" in data frames: both paths resent
  o.resend.unacked_bytes = budget;
  o.resend.retry_delay = std::chrono::milliseconds(1);
  o.resend.max_retry_delay = std::chrono::milliseconds(4);
  return o;
}

/// Kill points for connection n: a frame count that varies, so kills fall
/// on every kind of frame boundary (before blob_begin, entry_begin, data,
/// tail), for the first `kills` connections.
std::uint64_t kill_at(int n, int kills) {
  if (n >= kills) return kill_switch::never;
  return 40 + (static_cast<std::uint64_t>(n) * 7919u) % 900u;
}

struct run_result {
  sender_stats stats;
  std::error_code shutdown_ec, first_emit_ec;
  std::uint64_t peak_unacked = 0;
};

/// `producers` coroutines send blobs [0, n) over a resend session on `l`;
/// `serve` checks them, its delivery log remembering `dedup_window` tags.
/// Returns the sender's view.
run_result stream(runner& r, reconnect_link& l, delivery_checker& check, std::uint64_t n, int producers,
                  sender_options opt, consumer_options copt = {},
                  std::uint32_t dedup_window = default_dedup_window) {
  run_result out;
  auto log = std::make_shared<delivery_log>(dedup_window);
  auto done = [&] { return check.completed.size() >= n; };
  auto server = [&]() -> asio::awaitable<void> {
    co_await serve(l, log, check, done, copt);
  };
  r.spawn(server());
  auto snd = r.await(start_resend(l, opt));
  int finished = 0;
  auto produce = [&](int p) -> asio::awaitable<void> {
    for (std::uint64_t i = p; i < n; i += producers) {
      auto spec = make_blob(i, check.scale);
      auto ec = co_await send_blob(snd, spec);
      out.peak_unacked = std::max(out.peak_unacked, snd.unacked_bytes());
      if (ec && !out.first_emit_ec) out.first_emit_ec = ec;
      if (ec) break;
    }
    if (++finished == producers) {
      out.shutdown_ec = co_await snd.shutdown();
      out.stats = snd.stats();
      l.close();  // the server's next accept ends
    }
  };
  for (int p = 0; p < producers; ++p) r.spawn(produce(p));
  const bool finished_in_time = r.run(std::chrono::seconds(long_run() ? 900 : 60));
  if (!finished_in_time) {
    const auto st = snd.stats();
    BOOST_TEST_MESSAGE("hung: " << check.completed.size() << " of " << n << " complete, "
                                << l.connections() << " connections, reconnects "
                                << st.reconnects << ", delivered " << st.blobs_delivered
                                << ", unacked " << snd.unacked_bytes() << ", error "
                                << snd.error().message());
  }
  BOOST_TEST_REQUIRE(finished_in_time);
  return out;
}

}  // namespace

// A resend session keeps at most the consumer's dedup_window blobs (the
// tags its delivery log remembers, the hello's dedup_window): with a window
// of 2 and four producers, a third blob waits for a delivery instead of
// failing, and every blob arrives once.
BOOST_AUTO_TEST_CASE(blobs_past_the_consumers_dedup_window_wait_for_a_delivery) {
  runner r;
  auto l = make_link(link_kind::loopback, r.ex());
  delivery_checker check;
  auto out = stream(r, *l, check, 200, 4, fast_retry(), {}, 2);
  BOOST_TEST(!out.first_emit_ec, out.first_emit_ec.message());
  BOOST_TEST(!out.shutdown_ec, out.shutdown_ec.message());
  BOOST_TEST(check.all_once(200), check.first_problem);
}

// ---- delivery_log ----------------------------------------------------------

BOOST_AUTO_TEST_CASE(delivery_log_remembers_the_last_window_tags_per_session) {
  delivery_log log(3, 8);
  const auto a = session_of(1), b = session_of(2);
  for (std::uint64_t i = 0; i < 5; ++i) log.record(a, tag_of(i));
  log.record(b, tag_of(0));
  BOOST_TEST(!log.contains(a, tag_of(0)));  // beyond the window
  BOOST_TEST(!log.contains(a, tag_of(1)));
  for (std::uint64_t i = 2; i < 5; ++i) BOOST_TEST(log.contains(a, tag_of(i)));
  BOOST_TEST(log.contains(b, tag_of(0)));   // sessions are separate
  BOOST_TEST(!log.contains(b, tag_of(2)));
  log.record(a, tag_of(4));                  // again: no change, no eviction
  BOOST_TEST(log.contains(a, tag_of(2)));
  BOOST_TEST(log.tags() == 4u);
  BOOST_TEST(log.window() == 3u);
}

BOOST_AUTO_TEST_CASE(delivery_log_forgets_the_least_recently_used_session) {
  delivery_log log(4, 2);
  log.record(session_of(1), tag_of(1));
  log.record(session_of(2), tag_of(2));
  log.record(session_of(1), tag_of(3));  // session 1 used last
  log.record(session_of(3), tag_of(4));  // evicts session 2
  BOOST_TEST(log.sessions() == 2u);
  BOOST_TEST(log.contains(session_of(1), tag_of(1)));
  BOOST_TEST(!log.contains(session_of(2), tag_of(2)));
  BOOST_TEST(log.contains(session_of(3), tag_of(4)));
}

// ---- exactly once across reconnects -----------------------------------------

// The headline guarantee: a 10,000-blob stream from four producers whose
// connection is killed 25 times at varying frame boundaries (the sender's
// end closes instead of sending a frame). Every blob completes exactly once
// and byte-identical; the sender's kept bytes stay within the budget.
BOOST_AUTO_TEST_CASE(resend_delivers_every_blob_once_across_repeated_kills) {
  const std::uint64_t n = long_run() ? 200000 : sanitized ? 4000 : 10000;
  const int kills = long_run() ? 200 : 25;
  for (link_kind k : both) {
    BOOST_TEST_CONTEXT(link_name(k)) {
      runner r;
      auto l = make_link(k, r.ex());
      l->wrap = [kills](std::unique_ptr<transport> t, int conn) -> std::unique_ptr<transport> {
        return std::make_unique<kill_switch>(std::move(t), kill_at(conn, kills));
      };
      delivery_checker check;
      const std::uint64_t budget = 64 << 10;
      auto opt = fast_retry(budget);
      // A kill may cut a connection before any delivery ack is read on it
      // (one write burst): that many in a row are attempts that delivered
      // nothing, which max_attempts must allow.
      opt.resend.max_attempts = kills + 1;
      auto out = stream(r, *l, check, n, 4, opt);
      BOOST_TEST(!out.first_emit_ec, out.first_emit_ec.message());
      BOOST_TEST(!out.shutdown_ec, out.shutdown_ec.message());
      BOOST_TEST(check.all_once(n), check.first_problem);
      BOOST_TEST(check.final_aborts == 0u);
      BOOST_TEST(out.stats.reconnects == static_cast<std::uint64_t>(kills));
      BOOST_TEST(out.stats.blobs_resent > 0u);
      BOOST_TEST(out.stats.blobs_delivered >= n);
      // Counted once each when emitted, not again when sent or resent
      // (two entries a blob).
      BOOST_TEST(out.stats.entries_sent == 2 * n);
      BOOST_TEST(out.stats.blobs_sent == n);
      BOOST_TEST(check.attempts_voided > 0u);  // kills did cut blobs in half
      // The oldest blob may exceed the budget alone; these blobs are small.
      BOOST_TEST(out.peak_unacked <= budget + 1024);
    }
  }
}

// Resets from the network itself (fault_proxy): RST at a frame boundary,
// RST in the middle of a frame's payload, and a FIN in the middle of one
// (a truncated frame), on the first 15 connections.
BOOST_AUTO_TEST_CASE(resend_over_tcp_survives_resets_mid_frame) {
  runner r;
  tcp_link l(r.ex());
  fault_proxy proxy(r.ex(), l.listen_port(), [](int conn) {
    fault_plan p;
    if (conn >= 15) return p;
    p.at_frame = 30 + (static_cast<std::size_t>(conn) * 37) % 400;
    const fault kinds[] = {fault::reset, fault::reset_mid, fault::truncate};
    p.what = kinds[conn % 3];
    return p;
  });
  l.via_port = proxy.port();
  l.on_close = [&] { proxy.stop(); };
  auto run_proxy = [&]() -> asio::awaitable<void> { co_await proxy.run(); };
  r.spawn(run_proxy());
  delivery_checker check;
  const std::uint64_t n = 1500;
  auto opt = fast_retry();
  opt.resend.max_attempts = 16;  // 15 faults, each possibly before any ack is read
  auto out = stream(r, l, check, n, 3, opt);
  BOOST_TEST(!out.first_emit_ec, out.first_emit_ec.message());
  BOOST_TEST(!out.shutdown_ec, out.shutdown_ec.message());
  BOOST_TEST(check.all_once(n), check.first_problem);
  BOOST_TEST(out.stats.reconnects == 15u);
}

// The consumer delivers blob 0 and dies instead of acknowledging it (the
// ack is lost with the connection). The sender sends blob 0 again; the
// consumer of the next connection finds its tag in the shared delivery log
// and drops it without telling the application.
BOOST_AUTO_TEST_CASE(resent_blob_whose_ack_was_lost_is_dropped_as_duplicate) {
  for (link_kind k : both) {
    BOOST_TEST_CONTEXT(link_name(k)) {
      runner r;
      auto l = make_link(k, r.ex());
      l->wrap_c = lose_first_connections_ack(0);
      delivery_checker check;
      auto out = stream(r, *l, check, 20, 1, fast_retry());
      BOOST_TEST(!out.shutdown_ec, out.shutdown_ec.message());
      BOOST_TEST(check.all_once(20), check.first_problem);
      BOOST_TEST(out.stats.reconnects == 1u);
      BOOST_TEST(check.duplicates >= 1u);
    }
  }
}

// A kept blob aborted before any of it went out (nothing emitted) is
// forgotten: the consumer never hears of it, neither a blob_begin nor an
// abort, and the blobs around it arrive as usual.
BOOST_AUTO_TEST_CASE(a_blob_aborted_before_any_of_it_went_out_never_reaches_the_consumer) {
  runner r;
  auto l = make_link(link_kind::loopback, r.ex());
  delivery_checker check;
  auto done = [&] { return check.completed.size() >= 2; };
  auto server = [&]() -> asio::awaitable<void> {
    co_await serve(*l, std::make_shared<delivery_log>(), check, done);
  };
  r.spawn(server());
  auto snd = r.await(start_resend(*l, fast_retry()));
  std::error_code shut;
  bool finished = false;
  auto produce = [&]() -> asio::awaitable<void> {
    auto s0 = make_blob(0);
    BLOBPIPE_CO_CHECK(send_blob(snd, s0));
    auto w = snd.open_blob(tag_of(1));
    BLOBPIPE_CO_CHECK(w.abort("nothing to send after all"));
    auto s2 = make_blob(2);
    BLOBPIPE_CO_CHECK(send_blob(snd, s2));
    shut = co_await snd.shutdown();
    finished = true;
    l->close();
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(finished);
  BOOST_TEST(!shut, shut.message());
  // Blob 1 never begun: no abort of it, final or voided (one left open).
  BOOST_TEST(check.final_aborts == 0u);
  BOOST_TEST(check.attempts_voided == 0u);
  BOOST_TEST(check.completed.size() == 2u);
  BOOST_TEST(check.bad == 0u, check.first_problem);
}

// A producer's abort is final and reported once, even when its
// acknowledgement is lost and the sender repeats it on the next connection.
BOOST_AUTO_TEST_CASE(producer_abort_is_reported_once_across_a_lost_ack) {
  for (link_kind k : both) {
    BOOST_TEST_CONTEXT(link_name(k)) {
      runner r;
      auto l = make_link(k, r.ex());
      // Delivery acks on connection 0: #0 blob 0, #1 the abort of blob 1.
      l->wrap_c = lose_first_connections_ack(1);
      auto log = std::make_shared<delivery_log>();
      delivery_checker check;
      std::vector<event> aborts;
      bool finished = false;
      auto server = [&]() -> asio::awaitable<void> {
        consumer_options copt;
        copt.delivered = log;
        for (;;) {
          auto [aec, t] = co_await l->accept();
          if (aec) break;
          auto [ec, c] = co_await consumer::start(std::move(t), copt);
          if (ec) continue;
          for (;;) {
            auto ev = co_await c.next();
            if (ev.kind == event_kind::blob_aborted && !ev.resend) aborts.push_back(ev);
            if (!check.on(&c, ev)) break;
          }
          check.duplicates += c.stats().duplicates_dropped;
        }
      };
      r.spawn(server());
      auto snd = r.await(start_resend(*l, fast_retry()));
      std::error_code shut;
      auto produce = [&]() -> asio::awaitable<void> {
        auto s0 = make_blob(0);
        BLOBPIPE_CO_CHECK(send_blob(snd, s0));
        auto w = snd.open_blob(tag_of(1));
        auto v = value::tensor(s0.a);
        BLOBPIPE_CO_CHECK(w.emit("a", std::move(v)));
        BLOBPIPE_CO_CHECK(w.abort("rollout cancelled"));
        auto s2 = make_blob(2);
        BLOBPIPE_CO_CHECK(send_blob(snd, s2));
        shut = co_await snd.shutdown();
        finished = true;
        l->close();
      };
      r.spawn(produce());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(finished);
      BOOST_TEST(!shut, shut.message());
      BOOST_TEST_REQUIRE(aborts.size() == 1u);
      BOOST_TEST(index_of(aborts[0].tag) == 1u);
      BOOST_TEST((aborts[0].error == errc::aborted));
      BOOST_TEST(aborts[0].reason == "rollout cancelled");
      BOOST_TEST(check.completed.size() == 2u);  // blobs 0 and 2, once each
      BOOST_TEST(check.completed.count(1) == 0u);
      BOOST_TEST(check.bad == 0u, check.first_problem);
      BOOST_TEST(check.duplicates >= 1u);
    }
  }
}

// Kept bytes are bounded: with a budget of a few blobs and a consumer that
// holds every entry for a while, producers wait instead of growing memory.
BOOST_AUTO_TEST_CASE(producers_wait_when_the_unacked_budget_is_full) {
  runner r;
  loopback_link l(r.ex());
  delivery_checker check;
  check.scale = 20;  // blobs of roughly 0.3 .. 2.5 KiB
  const std::uint64_t budget = 8 << 10;
  auto out = stream(r, l, check, 300, 4, fast_retry(budget));
  BOOST_TEST(!out.shutdown_ec, out.shutdown_ec.message());
  BOOST_TEST(check.all_once(300), check.first_problem);
  BOOST_TEST(out.stats.budget_waits > 0u);
  BOOST_TEST(out.peak_unacked <= budget + 4096);  // + the oldest blob admitted alone
}

// The oldest kept blob is always admitted (docs/reliability.md "Delivery
// guarantee"), so a budget smaller than every entry cannot deadlock: each
// blob goes alone, and each is delivered once.
BOOST_AUTO_TEST_CASE(blobs_larger_than_the_unacked_budget_are_sent_one_at_a_time) {
  runner r;
  loopback_link l(r.ex());
  delivery_checker check;
  check.scale = 64;  // entry "a" of 768 bytes and more
  const std::uint64_t budget = 512;
  auto out = stream(r, l, check, 40, 2, fast_retry(budget));
  BOOST_TEST(!out.shutdown_ec, out.shutdown_ec.message());
  BOOST_TEST(check.all_once(40), check.first_problem);
  BOOST_TEST(out.stats.budget_waits > 0u);  // the second producer waited its turn
}

// When no consumer comes back, the sender gives up after max_attempts
// connection attempts and fails its producers instead of hanging.
BOOST_AUTO_TEST_CASE(resend_sender_gives_up_when_no_consumer_returns) {
  for (link_kind k : both) {
    BOOST_TEST_CONTEXT(link_name(k)) {
      runner r;
      auto l = make_link(k, r.ex());
      l->wrap = [](std::unique_ptr<transport> t, int) -> std::unique_ptr<transport> {
        return std::make_unique<kill_switch>(std::move(t), 8);
      };
      auto log = std::make_shared<delivery_log>();
      delivery_checker check;
      auto server = [&]() -> asio::awaitable<void> {
        // One connection only, then the trainer is gone for good.
        consumer_options copt;
        copt.delivered = log;
        auto [aec, t] = co_await l->accept();
        l->close();
        if (aec) co_return;
        auto [ec, c] = co_await consumer::start(std::move(t), copt);
        if (ec) co_return;
        for (;;) {
          auto ev = co_await c.next();
          if (!check.on(&c, ev)) break;
        }
      };
      r.spawn(server());
      auto opt = fast_retry(4 << 10);  // producers soon wait on the budget
      opt.resend.max_attempts = 3;
      auto snd = r.await(start_resend(*l, opt));
      std::error_code emit_ec, shut_ec;
      auto produce = [&]() -> asio::awaitable<void> {
        for (std::uint64_t i = 0; i < 1000 && !emit_ec; ++i) {
          auto spec = make_blob(i);
          emit_ec = co_await send_blob(snd, spec);
        }
        shut_ec = co_await snd.shutdown();
      };
      r.spawn(produce());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((emit_ec == errc::peer_failed || emit_ec == errc::peer_closed),
                 emit_ec.message());
      BOOST_TEST((shut_ec == emit_ec));
      BOOST_TEST((snd.error() == emit_ec));
      BOOST_TEST(snd.stats().reconnects == 0u);
    }
  }
}

// ---- consumers that deliver nothing ------------------------------------------

namespace {

/// What a scripted consumer does on one connection (play_consumer).
enum class consumer_play {
  close,              ///< answers the hello, then closes
  close_with_reason,  ///< answers the hello, sends close with a reason, closes
  silent,             ///< answers the hello, then reads and never answers
};

/// The reply a resend consumer gives `offer`: its session echoed, a
/// delivery window, no credit grants.
hello consumer_reply(const hello& offer) {
  hello r{.role = wire_role::consumer};
  r.max_chunk_bytes = offer.max_chunk_bytes;
  r.inline_bytes = offer.inline_bytes;
  r.window_bytes = 1u << 20;
  r.session = offer.session;
  r.dedup_window = 4096;
  return r;
}

/// Plays one connection of a consumer that never acknowledges a delivery.
asio::awaitable<void> play_consumer(std::unique_ptr<transport> t, consumer_play play,
                                    std::string reason) {
  frame_reader in;
  auto [ec, f] = co_await in.next(*t);
  if (ec) co_return;
  auto offer = decode_hello(f.payload);
  if (!offer) co_return;
  const auto why = std::as_bytes(std::span(reason.data(), reason.size()));
  (void)co_await send_frame(*t, {.type = frame_type::hello}, encode_hello(consumer_reply(*offer)));
  if (play == consumer_play::close_with_reason)
    (void)co_await send_frame(*t, {.type = frame_type::close}, why);
  if (play == consumer_play::silent) {
    for (;;) {
      auto [rec, g] = co_await in.next(*t);
      if (rec) break;  // the sender dropped the connection
    }
  }
  t->close();
}

struct fruitless_run {
  std::error_code shutdown_ec, error;
  std::string reason;
  int connections = 0;
};

/// A resend session (max_attempts 3) sends one blob and shuts down while
/// connection n of the consumer plays `play(n)`; every connection
/// delivers nothing, so shutdown() must end with the session's error.
fruitless_run against_fruitless_consumer(std::function<consumer_play(int)> play,
                                         const std::string& reason,
                                         std::chrono::milliseconds stall = {},
                                         std::function<void(sender_options&)> tune = {}) {
  runner r;
  loopback_link l(r.ex());
  auto server = [&]() -> asio::awaitable<void> {
    for (int n = 0;; ++n) {
      auto [aec, t] = co_await l.accept();
      if (aec) break;
      co_await play_consumer(std::move(t), play(n), reason);
    }
  };
  r.spawn(server());
  auto opt = fast_retry();
  opt.resend.max_attempts = 3;
  opt.stall_timeout = stall;
  if (tune) tune(opt);
  auto snd = r.await(start_resend(l, opt));
  fruitless_run out;
  auto produce = [&]() -> asio::awaitable<void> {
    auto spec = make_blob(0);
    (void)co_await send_blob(snd, spec);  // kept: a reconnect does not fail it
    out.shutdown_ec = co_await snd.shutdown();
    l.close();
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
  out.error = snd.error();
  out.reason = snd.failure_reason();
  out.connections = l.connections();
  return out;
}

bool has(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

// A producer cancelled while its entry waits for room in unacked_bytes
// (the consumer delivers nothing, so the kept bytes never go) stops
// waiting: its emit returns operation_aborted at once, the entry not kept.
BOOST_AUTO_TEST_CASE(a_producer_cancelled_waiting_for_the_unacked_budget_stops_waiting) {
  runner r;
  loopback_link l(r.ex());
  auto server = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto [aec, t] = co_await l.accept();
      if (aec) break;
      co_await play_consumer(std::move(t), consumer_play::silent, "");
    }
  };
  r.spawn(server());
  auto snd = r.await(start_resend(l, fast_retry(1024)));
  const std::vector<float> first(256, 1.0f), second(256, 2.0f);  // 1 KiB each
  std::error_code kept, emitted;
  bool returned = false;
  std::uint64_t waits_before = 0, kept_before = 0, kept_after = 0;
  asio::cancellation_signal cancel;
  auto wait_for_budget = [&]() -> asio::awaitable<void> {
    auto b = snd.open_blob(tag_of(2));
    emitted = co_await b.emit("a", value::tensor(second));
    returned = true;
  };
  auto produce = [&]() -> asio::awaitable<void> {
    auto a = snd.open_blob(tag_of(1));
    kept = co_await a.emit("a", value::tensor(first));  // the oldest: admitted alone
    waits_before = snd.stats().budget_waits;
    kept_before = snd.unacked_bytes();
    asio::co_spawn(r.ctx, wait_for_budget(), asio::bind_cancellation_slot(cancel.slot(),
                                                                         asio::detached));
    asio::steady_timer t(r.ctx);
    while (snd.stats().budget_waits == waits_before) {  // the runner's limit bounds it
      t.expires_after(std::chrono::milliseconds(10));
      co_await t.async_wait(asio::use_awaitable);
    }
    BOOST_TEST(snd.stats().budget_waits == waits_before + 1, "the second entry waits for room");
    cancel.emit(asio::cancellation_type::terminal);
    for (int i = 0; i < 100 && !returned; ++i) {
      t.expires_after(std::chrono::milliseconds(10));
      co_await t.async_wait(asio::use_awaitable);
    }
    kept_after = snd.unacked_bytes();
    snd.close();
    l.close();
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
  BOOST_TEST(!kept, kept.message());
  BOOST_TEST(kept_after == kept_before, "the cancelled entry was kept");
  BOOST_TEST(returned, "the cancelled emit returned within 1 s");
  BOOST_TEST((emitted == asio::error::operation_aborted), emitted.message());
}

// Only a connection that delivers nothing counts: here every connection's
// consumer delivers (acknowledges) one blob and dies before its second
// acknowledgement, a dozen connections in all, and a session allowed
// max_attempts 2 goes on and delivers every blob once.
BOOST_AUTO_TEST_CASE(a_connection_that_delivers_resets_the_count) {
  for (link_kind k : both) {
    BOOST_TEST_CONTEXT(link_name(k)) {
      runner r;
      auto l = make_link(k, r.ex());
      l->wrap_c = [](std::unique_ptr<transport> t, int) -> std::unique_ptr<transport> {
        return std::make_unique<kill_switch>(std::move(t), kill_switch::never, 1);
      };
      delivery_checker check;
      auto opt = fast_retry();
      opt.resend.max_attempts = 2;
      auto out = stream(r, *l, check, 12, 1, opt);
      BOOST_TEST(!out.first_emit_ec, out.first_emit_ec.message());
      BOOST_TEST(!out.shutdown_ec, out.shutdown_ec.message());
      BOOST_TEST(check.all_once(12), check.first_problem);
      BOOST_TEST(out.stats.reconnects >= 2u);  // more connections ended than max_attempts
    }
  }
}

namespace {

/// Shared by the two ends of `late_words`: whether the next connection's
/// hello is written, and whether the old one's late bytes were handed out.
struct late_words_state {
  bool next_hello_written = false;
  bool given = false;
};

/// Waits until `done()` holds, polling each millisecond, at most 5 s.
asio::awaitable<void> poll_until(const std::function<bool()>& done) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (int i = 0; i < 5000 && !done(); ++i) {
    t.expires_after(std::chrono::milliseconds(1));
    (void)co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
}

/// Connection 0 (`old_link`): when its read fails (the link was cut),
/// waits until connection 1 has written its hello, then returns one frame
/// header of 0xff bytes instead of the error: the last words of a replaced
/// link, read after the session began reading another one. Connection 1
/// reads only after those words were given.
class late_words final : public forwarding_transport {
 public:
  late_words(std::unique_ptr<transport> inner, std::shared_ptr<late_words_state> st,
             bool old_link)
      : forwarding_transport(std::move(inner)), st_(std::move(st)), old_(old_link) {}
  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) override {
    const std::error_code ec = co_await inner().write(bytes);
    if (!old_) st_->next_hello_written = true;
    co_return ec;
  }
  bool sends_bulk() const noexcept override { return false; }
  asio::awaitable<std::tuple<std::error_code, read_result>> read_some(
      std::span<std::byte> buf) override {
    // Named locals: GCC 12 mishandles temporaries passed into a coroutine.
    auto st = st_;
    const std::function<bool()> given = [st] { return st->given; };
    const std::function<bool()> next_hello = [st] { return st->next_hello_written; };
    if (!old_) {
      co_await poll_until(given);
      co_return co_await inner().read_some(buf);
    }
    auto got = co_await inner().read_some(buf);
    if (!std::get<0>(got) || st->given || buf.size() < frame_header_size) co_return got;
    // The reader is cancelled as its connection is replaced; these words
    // were read before that (a completion already queued).
    const bool throws = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    co_await poll_until(next_hello);
    co_await asio::this_coro::throw_if_cancelled(throws);
    std::fill_n(buf.begin(), frame_header_size, std::byte{0xff});
    st->given = true;
    co_return std::tuple{std::error_code{}, read_result{.bytes = frame_header_size}};
  }

 private:
  std::shared_ptr<late_words_state> st_;
  bool old_;
};

}  // namespace

// A reader of a replaced connection that still gets bytes (its read was
// completing as the connection was cut) does not feed them to the session,
// which now reads the next connection's frames: here they would be a
// violation, and the session would end. The stream goes on, every blob
// delivered once.
BOOST_AUTO_TEST_CASE(bytes_read_from_a_replaced_connection_are_not_the_next_ones) {
  runner r;
  auto l = make_link(link_kind::loopback, r.ex());
  auto st = std::make_shared<late_words_state>();
  l->wrap = [st](std::unique_ptr<transport> t, int conn) -> std::unique_ptr<transport> {
    if (conn == 0)
      return std::make_unique<late_words>(std::make_unique<kill_switch>(std::move(t), 40), st,
                                          true);
    if (conn == 1) return std::make_unique<late_words>(std::move(t), st, false);
    return t;
  };
  delivery_checker check;
  auto out = stream(r, *l, check, 40, 1, fast_retry());
  BOOST_TEST(st->given, "connection 0's reader was not reading when it was replaced");
  BOOST_TEST(!out.first_emit_ec, out.first_emit_ec.message());
  BOOST_TEST(!out.shutdown_ec, out.shutdown_ec.message());
  BOOST_TEST(check.all_once(40), check.first_problem);
  BOOST_TEST(out.stats.reconnects == 1u);
}

// A worker between steps keeps no blob: a consumer that drops its idle
// connections (idle_timeout, a fan-in server's idle reclaim) delivers
// nothing on them, but nothing waited for delivery, so they do not count
// toward max_attempts. Here the first six connections are closed right
// after the handshake (twice max_attempts); the seventh is a real
// consumer, and the blob sent then is delivered.
BOOST_AUTO_TEST_CASE(connections_dropped_while_nothing_is_kept_do_not_end_the_session) {
  runner r;
  loopback_link l(r.ex());
  consumer c;
  bool completed = false;
  auto real = [&](std::unique_ptr<transport> t) -> asio::awaitable<void> {
    auto [ec, started] = co_await consumer::start(std::move(t), {});
    if (ec) co_return;
    c = std::move(started);
    for (;;) {
      auto ev = co_await c.next();
      if (ev.kind == event_kind::blob_complete) completed = true;
      if (ev.kind == event_kind::end_of_stream) break;
    }
  };
  auto server = [&]() -> asio::awaitable<void> {
    for (int n = 0;; ++n) {
      auto [aec, t] = co_await l.accept();
      if (aec) break;
      if (n < 6) {
        co_await play_consumer(std::move(t), consumer_play::close, "");
      } else {
        co_await real(std::move(t));
      }
    }
  };
  r.spawn(server());
  auto opt = fast_retry();
  opt.resend.max_attempts = 3;
  auto snd = r.await(start_resend(l, opt));
  std::error_code sent_ec, shutdown_ec;
  auto produce = [&]() -> asio::awaitable<void> {
    // Idle until the real consumer is connected (a hang guard bounds it).
    asio::steady_timer poll(co_await asio::this_coro::executor);
    for (int i = 0; i < 20000 && l.connections() < 7 && !snd.error(); ++i) {
      poll.expires_after(std::chrono::milliseconds(1));
      co_await poll.async_wait(asio::use_awaitable);
    }
    auto spec = make_blob(0);
    sent_ec = co_await send_blob(snd, spec);
    shutdown_ec = co_await snd.shutdown();
    l.close();
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(60)));
  BOOST_TEST(!sent_ec, sent_ec.message());
  BOOST_TEST(!shutdown_ec, shutdown_ec.message() << ": " << snd.failure_reason());
  BOOST_TEST(snd.failure_reason().find("max_attempts") == std::string::npos, snd.failure_reason());
  BOOST_TEST(l.connections() == 7);
  BOOST_TEST(completed);
}

// A consumer that completes the handshake and then closes delivers
// nothing: after max_attempts such connections in a row the session ends
// (shutdown() returns instead of reconnecting for ever), with the last
// connection's error and a reason naming max_attempts; each connection was
// one attempt, so the sender made exactly max_attempts of them.
BOOST_AUTO_TEST_CASE(a_resend_session_gives_up_on_connections_that_deliver_nothing) {
  auto out = against_fruitless_consumer([](int) { return consumer_play::close; }, "");
  BOOST_TEST((out.shutdown_ec == errc::peer_closed), out.shutdown_ec.message());
  BOOST_TEST((out.error == errc::peer_closed), out.error.message());
  BOOST_TEST(has(out.reason, "no blob delivered on 3 connection attempts in a row (max_attempts 3)"),
             out.reason);
  BOOST_TEST(out.connections == 3);
}

// No wait before a retry is longer than max_retry_delay: a retry_delay of
// an hour waits 4 ms, and the session gives up within the run's 30 s.
BOOST_AUTO_TEST_CASE(a_retry_delay_above_max_retry_delay_waits_max_retry_delay) {
  auto out = against_fruitless_consumer([](int) { return consumer_play::close; }, "", {},
                                        [](sender_options& o) {
                                          o.resend.retry_delay = std::chrono::hours(1);
                                          o.resend.max_retry_delay = std::chrono::milliseconds(4);
                                        });
  BOOST_TEST((out.error == errc::peer_closed), out.error.message());
  BOOST_TEST(out.connections == 3);
}

// The consumer's close reason (a consumer refusing the stream each time)
// is the cause the session names when it gives up, escaped.
BOOST_AUTO_TEST_CASE(a_resend_session_that_gives_up_names_the_consumers_close_reason) {
  const std::string reason = "entry 'a' of 4096 bytes is over max_entry_bytes (16)";
  auto out = against_fruitless_consumer([](int) { return consumer_play::close_with_reason; },
                                        reason);
  BOOST_TEST((out.error == errc::peer_closed), out.error.message());
  BOOST_TEST(has(out.reason, "max_attempts 3"), out.reason);
  BOOST_TEST(has(out.reason, "the consumer closed the stream: " + escape(reason)), out.reason);
  BOOST_TEST(out.connections == 3);
}

// A consumer that completes the handshake and then reads without ever
// acknowledging: each connection ends at stall_timeout, delivers nothing
// and counts, and the session ends naming both limits.
BOOST_AUTO_TEST_CASE(a_resend_session_gives_up_on_a_consumer_that_goes_silent) {
  auto out = against_fruitless_consumer([](int) { return consumer_play::silent; }, "",
                                        std::chrono::milliseconds(200));
  BOOST_TEST((out.error == errc::timed_out), out.error.message());
  BOOST_TEST(has(out.reason, "max_attempts 3"), out.reason);
  BOOST_TEST(has(out.reason, "(stall_timeout)"), out.reason);
  BOOST_TEST(out.connections == 3);
}

// A consumer that grants a window of 2^64 - 1 and then reads nothing: the
// resend session's own queue stays within max_queued_bytes (its kept
// bytes within unacked_bytes), its wait for room is under stall_timeout,
// so each connection ends, delivers nothing and counts, and the session
// gives up instead of hanging.
BOOST_AUTO_TEST_CASE(a_resend_session_bounds_its_queue_against_a_consumer_that_reads_nothing) {
  runner r;
  tcp_link l(r.ex());
  std::vector<std::unique_ptr<transport>> unread;  // answered, then never read
  auto server = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto [aec, t] = co_await l.accept();
      if (aec) break;
      frame_reader in;
      auto [ec, f] = co_await in.next(*t);
      if (ec) continue;
      auto offer = decode_hello(f.payload);
      if (!offer) continue;
      hello reply = consumer_reply(*offer);
      reply.window_bytes = ~std::uint64_t{0};
      (void)co_await send_frame(*t, {.type = frame_type::hello}, encode_hello(reply));
      unread.push_back(std::move(t));
    }
  };
  r.spawn(server());
  constexpr std::uint64_t budget = 64 << 20;  // far past the kernel's buffers
  constexpr std::size_t max_queued = 64 << 10;
  auto opt = fast_retry(budget);
  opt.chunk_bytes = default_chunk_bytes;
  opt.inline_bytes = 64 << 10;  // every entry copied into its entry_begin
  opt.max_queued_bytes = max_queued;
  opt.resend.max_attempts = 3;
  opt.stall_timeout = std::chrono::milliseconds(300);
  auto snd = r.await(start_resend(l, opt));
  std::error_code emit_ec;
  std::uint64_t peak_unacked = 0;
  auto produce = [&]() -> asio::awaitable<void> {
    const auto x = ramp(8 << 10, 1.0f);  // 32 KiB
    for (std::uint64_t i = 0; i < 4096 && !emit_ec; ++i) {
      auto w = snd.open_blob(tag_of(i));
      emit_ec = co_await w.emit("x", value::tensor(x));
      if (!emit_ec) emit_ec = co_await w.finish();
      peak_unacked = std::max(peak_unacked, snd.unacked_bytes());
    }
    l.close();
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(60)));
  BOOST_TEST((emit_ec == errc::timed_out), emit_ec.message());
  BOOST_TEST(has(snd.failure_reason(), "max_attempts 3"), snd.failure_reason());
  BOOST_TEST(has(snd.failure_reason(), "(stall_timeout)"), snd.failure_reason());
  BOOST_TEST(l.connections() == 3);
  const auto st = snd.stats();
  BOOST_TEST(st.queued_high_water > max_queued);  // it did fill up
  BOOST_TEST(st.queued_high_water <= 2 * (max_queued + (33 << 10)));
  BOOST_TEST(peak_unacked <= budget);
}
