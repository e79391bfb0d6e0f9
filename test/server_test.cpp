// blobpipe/cluster/server.hpp: many senders into one server — the merged
// stream naming each event's connection, one budget shared and never
// exceeded, a killed or misbehaving sender ending only its own blobs, the
// connection cap, the handshake timeout, drain and close.
#define BOOST_TEST_MODULE server_test
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <deque>
#include <set>
#include <thread>

#include <asio/detached.hpp>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "test/cluster_fixture.hpp"
#include "test/heap_counter.hpp"
#include "test/skip.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

/// The events of connection `conn`, in order.
std::vector<seen> of(const std::vector<seen>& v, std::uint64_t conn) {
  std::vector<seen> out;
  for (const auto& s : v)
    if (s.conn == conn) out.push_back(s);
  return out;
}

/// Checks every connection's events are opened, its own, closed: each
/// entry's and blob's tag names one sender per connection.
void check_attribution(const std::vector<seen>& v) {
  std::map<std::uint64_t, std::set<std::uint32_t>> senders;
  for (const auto& s : v) {
    if (s.kind == server_event_kind::entry_ready || s.kind == server_event_kind::blob_complete)
      senders[s.conn].insert(tag_sender(s.tag));
  }
  std::set<std::uint32_t> all;
  for (const auto& [conn, who] : senders) {
    BOOST_TEST(who.size() == 1u, "connection " << conn << " carries several senders' blobs");
    all.insert(who.begin(), who.end());
    const auto mine = of(v, conn);
    BOOST_TEST_REQUIRE(!mine.empty());
    BOOST_TEST(mine.front().kind == server_event_kind::connection_opened);
    BOOST_TEST(mine.back().kind == server_event_kind::connection_closed);
    BOOST_TEST(!mine.front().peer.empty());
  }
  BOOST_TEST(all.size() == senders.size(), "a sender's blobs came on several connections");
}

}  // namespace

// server.hpp listen: a URL the transports cannot listen on is refused with
// the listener's error, before a server exists.
BOOST_AUTO_TEST_CASE(listen_on_a_url_no_transport_takes_is_invalid_argument) {
  runner r;
  auto s = server::listen(r.ex(), "sctp://127.0.0.1:0");
  BOOST_TEST_REQUIRE(!s.has_value());
  BOOST_TEST((s.code() == errc::invalid_argument), s.message());
  BOOST_TEST(s.message().find("sctp") != std::string::npos, s.message());
}

BOOST_AUTO_TEST_CASE(many_senders_merge_into_one_stream_naming_each_connection) {
  // Over TCP also with two receive threads (server_options::threads): the
  // connections decode there, and every event still reaches the
  // application on its own thread, in each connection's order.
  struct config {
    const char* url;
    std::size_t threads;
  };
  // Each sender's connection's events (kind, tag), per configuration: the
  // same whatever the number of receive threads.
  using sequence = std::vector<std::pair<server_event_kind, tag_t>>;
  std::vector<std::map<std::uint32_t, sequence>> per_sender;
  for (const auto [url, threads] : {config{"inproc://server-test-merge", 1},
                                    config{"tcp://127.0.0.1:0", 1},
                                    config{"tcp://127.0.0.1:0", 2}}) {
    BOOST_TEST_CONTEXT(url << ", threads " << threads) {
      runner r;
      server_options opt;
      opt.threads = threads;
      opt.budget_bytes = 64u << 10;  // small: credit moves between the threads
      opt.initial_grant_bytes = 4u << 10;
      auto srv = server::listen(r.ex(), url, opt).value();
      constexpr int senders = 8;
      std::vector<seen> got;
      std::set<std::size_t> threads_used;  // connection_stats::thread of each, when opened
      auto application = [&]() -> asio::awaitable<void> {
        std::size_t closed = 0;
        for (;;) {
          auto ev = co_await srv.next();
          got.push_back(record(ev));
          if (ev.kind == server_event_kind::connection_opened)
            for (const auto& c : srv.stats().connections)
              if (c.info->id == ev.connection->id) threads_used.insert(c.thread);
          if (ev.kind == server_event_kind::connection_closed && ++closed == senders)
            srv.stop_accepting();
          if (ev.kind == server_event_kind::end_of_stream) break;
        }
      };
      r.spawn(application());
      std::vector<std::error_code> sent(senders);
      for (int w = 0; w < senders; ++w) {
        r.spawn(send_into(
            srv.url(),
            {.who = static_cast<std::uint32_t>(w), .blobs = 10, .entries = 3, .bytes = 1000, .group = {}},
            sent[w]));
      }
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
      for (int w = 0; w < senders; ++w)
        BOOST_TEST(!sent[w], "sender " << w << ": " << sent[w].message());
      BOOST_TEST(count(got, server_event_kind::connection_opened) == std::size_t(senders));
      BOOST_TEST(count(got, server_event_kind::connection_closed) == std::size_t(senders));
      BOOST_TEST(count(got, server_event_kind::entry_ready) == std::size_t(senders * 10 * 3));
      BOOST_TEST(count(got, server_event_kind::blob_complete) == std::size_t(senders * 10));
      BOOST_TEST(count(got, server_event_kind::blob_aborted) == 0u);
      BOOST_TEST(got.back().kind == server_event_kind::end_of_stream);
      BOOST_TEST(!got.back().error);
      for (const auto& s : got) {
        BOOST_TEST(s.bytes_ok);
        if (s.kind == server_event_kind::connection_closed) BOOST_TEST(!s.error, s.error.message());
      }
      check_attribution(got);
      // Spread over the receive threads in turn (0: on the server's executor).
      const bool moves = threads > 1 && std::string_view(url).starts_with("tcp");
      if (moves) BOOST_TEST((threads_used == std::set<std::size_t>{1, 2}));
      else BOOST_TEST((threads_used == std::set<std::size_t>{0}));
      const auto app = std::this_thread::get_id();
      for (const auto& s : got) BOOST_TEST((s.on == app), "an event resumed next() elsewhere");
      // Each connection's blobs in its sender's order.
      std::map<std::uint64_t, std::uint32_t> next_blob;
      for (const auto& s : got) {
        if (s.kind != server_event_kind::blob_complete) continue;
        std::uint32_t k;
        std::memcpy(&k, s.tag.data() + 4, 4);
        BOOST_TEST(k == next_blob[s.conn]++, "connection " << s.conn << ": blobs out of order");
      }
      // Counted as yielded.
      const auto st = srv.stats();
      BOOST_TEST(st.accepted == std::uint64_t(senders));
      BOOST_TEST(st.total.entries == std::uint64_t(senders * 10 * 3));
      BOOST_TEST(st.total.bytes == std::uint64_t(senders * 10 * 3 * 1000));
      BOOST_TEST(st.total.blobs == std::uint64_t(senders * 10));
      BOOST_TEST(st.total.aborts == 0u);
      BOOST_TEST(st.open == 0u);
      BOOST_TEST(st.pool.committed_high_water <= st.pool.budget_bytes);
      BOOST_TEST(st.pool.overcommits == 0u);
      BOOST_TEST(st.tasks_running == 0u, "a task of the server outlived its end_of_stream");
      std::map<std::uint64_t, std::uint32_t> sender_of;
      for (const auto& s : got)
        if (s.kind == server_event_kind::blob_complete) sender_of[s.conn] = tag_sender(s.tag);
      auto& mine = per_sender.emplace_back();
      for (const auto& s : got)
        if (s.conn != 0) mine[sender_of[s.conn]].emplace_back(s.kind, s.tag);
    }
  }
  // Every connection's events in the order its sender sent them: opened,
  // each blob's entries then its end, closed; with one receive thread or two.
  BOOST_TEST_REQUIRE(per_sender.size() == 3u);
  BOOST_TEST(per_sender[0].size() == 8u);
  for (const auto& [who, events] : per_sender[0]) {
    BOOST_TEST_CONTEXT("sender " << who) {
      BOOST_TEST_REQUIRE(events.size() == std::size_t(2 + 10 * 4));
      BOOST_TEST((events.front().first == server_event_kind::connection_opened));
      for (std::size_t b = 0; b < 10; ++b) {
        for (std::size_t e = 0; e < 3; ++e)
          BOOST_TEST((events[1 + b * 4 + e].first == server_event_kind::entry_ready));
        BOOST_TEST((events[1 + b * 4 + 3].first == server_event_kind::blob_complete));
        BOOST_TEST((events[1 + b * 4 + 3].second == events[1 + b * 4].second));
      }
      BOOST_TEST((events.back().first == server_event_kind::connection_closed));
    }
  }
  BOOST_TEST((per_sender[1] == per_sender[0]), "TCP, one thread: another per-connection order");
  BOOST_TEST((per_sender[2] == per_sender[0]), "TCP, two threads: another per-connection order");
}

BOOST_AUTO_TEST_CASE(a_sender_killed_mid_blob_aborts_only_its_own_blobs) {
  runner r;
  server_options opt;
  opt.budget_bytes = 64 << 10;  // small: the senders share it and wait for credit
  auto srv = server::listen(r.ex(), "inproc://server-test-kill", opt).value();
  constexpr int healthy = 4;
  std::vector<seen> got;
  r.spawn(collect_into(srv, healthy + 1, got));
  std::vector<std::error_code> sent(healthy);
  for (int w = 0; w < healthy; ++w) {
    r.spawn(send_into(
        srv.url(), {.who = static_cast<std::uint32_t>(w), .blobs = 20, .entries = 2, .bytes = 4000, .group = {}},
        sent[w]));
  }
  // The victim: one entry of an open blob, then its connection dies.
  auto victim = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto [ec, t] = co_await blobpipe::connect(ex, srv.url());
    BOOST_TEST_REQUIRE(!ec);
    auto [sec, s] = co_await sender::start(std::move(t));
    BOOST_TEST_REQUIRE(!sec);
    auto blob = s.open_blob(numbered_tag(99, 0));
    const auto half = fixture_bytes(99, 0, 0, 4000);
    BLOBPIPE_CO_CHECK(blob.emit("e0", value::tensor(half)));
    BLOBPIPE_CO_CHECK(s.flush());
    co_await yield_n(50);
    s.close();  // gone: no abort, no close frame
  };
  r.spawn(victim());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  for (int w = 0; w < healthy; ++w)
    BOOST_TEST(!sent[w], "sender " << w << ": " << sent[w].message());
  std::size_t aborted = 0, victim_closed = 0;
  for (const auto& s : got) {
    if (s.kind == server_event_kind::blob_aborted) {
      ++aborted;
      BOOST_TEST(tag_sender(s.tag) == 99u);
      BOOST_TEST((s.error == errc::peer_closed || s.error == errc::peer_failed), s.error.message());
    }
    if (s.kind == server_event_kind::blob_complete) BOOST_TEST(tag_sender(s.tag) != 99u);
    if (s.kind == server_event_kind::connection_closed && s.error) ++victim_closed;
  }
  BOOST_TEST(aborted == 1u);
  BOOST_TEST(victim_closed == 1u);
  BOOST_TEST(count(got, server_event_kind::blob_complete) == std::size_t(healthy * 20));
  const auto st = srv.stats();
  BOOST_TEST(st.total.aborts == 1u);
  BOOST_TEST(st.pool.committed_high_water <= st.pool.budget_bytes);
  BOOST_TEST(st.pool.overcommits == 0u);
  BOOST_TEST(st.pool.credit_requests > 0u);  // the budget was tight: senders asked
}

BOOST_AUTO_TEST_CASE(a_sender_breaking_the_protocol_ends_only_its_connection) {
  runner r;
  auto srv = server::listen(r.ex(), "inproc://server-test-violation").value();
  std::vector<seen> got;
  r.spawn(collect_into(srv, 2, got));
  std::error_code good;
  r.spawn(send_into(srv.url(), {.who = 1, .blobs = 5, .entries = 2, .bytes = 100, .group = {}}, good));
  auto hostile = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto [ec, t] = co_await blobpipe::connect(ex, srv.url());
    BOOST_TEST_REQUIRE(!ec);
    // A hello (offering credit grants, as a fan-in server requires), then
    // a data frame for a blob that never began.
    BLOBPIPE_CO_CHECK(send_frame(
        *t, {.type = frame_type::hello},
        encode_hello({.role = wire_role::sender, .features = feature_credit_grants})));
    frame_reader reader;
    auto [hec, their_hello] = co_await reader.next(*t);
    BOOST_TEST(!hec);
    std::array<std::byte, 8> junk{};
    BLOBPIPE_CO_CHECK(send_frame(*t, {.type = frame_type::data, .blob_id = 5}, junk));
    // The server tells it why in a close frame, then closes it.
    auto [cec, close] = co_await reader.next(*t);
    BOOST_TEST(!cec);
    BOOST_TEST((close.header.type == frame_type::close));
    const std::string why(reinterpret_cast<const char*>(close.payload.data()), close.payload.size());
    BOOST_TEST(why.find("unknown blob 5") != std::string::npos, why);
    auto [eec, end] = co_await reader.next(*t);
    BOOST_TEST(eec);
  };
  r.spawn(hostile());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  BOOST_TEST(!good, good.message());
  BOOST_TEST(count(got, server_event_kind::blob_complete) == 5u);
  std::size_t violations = 0;
  for (const auto& s : got)
    violations +=
        s.kind == server_event_kind::connection_closed && s.error == errc::protocol_violation;
  BOOST_TEST(violations == 1u);
}

namespace {

/// A slow application holding its last six entries (released on its own
/// thread, the connections' possibly elsewhere) while four senders stream.
void slow_application_case(const char* url, std::size_t threads) {
  runner r;
  server_options opt;
  opt.budget_bytes = 48 << 10;
  opt.initial_grant_bytes = 4 << 10;
  opt.threads = threads;
  auto srv = server::listen(r.ex(), url, opt).value();
  constexpr int senders = 4;
  std::uint64_t worst = 0;  // most credit committed at any yield
  std::size_t entries = 0;
  std::map<std::uint64_t, std::size_t> per_conn;
  auto slow_application = [&]() -> asio::awaitable<void> {
    std::deque<std::shared_ptr<const received_entry>> held;  // the slow application
    std::size_t closed = 0;
    for (;;) {
      auto ev = co_await srv.next();
      const auto st = srv.stats();
      worst = std::max(worst, st.pool.committed_bytes);
      if (ev.kind == server_event_kind::entry_ready) {
        ++entries;
        ++per_conn[ev.connection->id];
        held.push_back(ev.ev.entry);
        if (held.size() > 6) held.pop_front();  // releases the oldest
        co_await yield_n(3);
      }
      if (ev.kind == server_event_kind::connection_closed && ++closed == senders) {
        held.clear();
        srv.stop_accepting();
      }
      if (ev.kind == server_event_kind::end_of_stream) break;
    }
  };
  r.spawn(slow_application());
  std::vector<std::error_code> sent(senders);
  for (int w = 0; w < senders; ++w) {
    r.spawn(send_into(
        srv.url(), {.who = static_cast<std::uint32_t>(w), .blobs = 10, .entries = 3, .bytes = 3000, .group = {}},
        sent[w]));
  }
  BOOST_TEST_REQUIRE(r.run());
  for (int w = 0; w < senders; ++w) BOOST_TEST(!sent[w], sent[w].message());
  BOOST_TEST(entries == std::size_t(senders * 30));
  BOOST_TEST(per_conn.size() == std::size_t(senders));
  const auto st = srv.stats();
  BOOST_TEST(worst <= opt.budget_bytes);
  BOOST_TEST(st.pool.committed_high_water <= opt.budget_bytes);
  BOOST_TEST(st.pool.overcommits == 0u);
  BOOST_TEST(st.total.credit_waits > 0u);
  if (threads == 1) {
    BOOST_TEST(st.pool.committed_bytes == 0u);  // everything released and the connections gone
    return;
  }
  // The last releases travel to the receive threads, which return them
  // to the pool: wait for that (bounded; the threads run on their own).
  for (int i = 0; i < 10'000 && srv.stats().pool.committed_bytes != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  BOOST_TEST(srv.stats().pool.committed_bytes == 0u, "released credit never came back");
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_slow_application_holding_entries_never_sees_the_budget_exceeded) {
  slow_application_case("inproc://server-test-slow", 1);
}

BOOST_AUTO_TEST_CASE(a_slow_application_on_two_receive_threads_never_sees_the_budget_exceeded) {
  slow_application_case("tcp://127.0.0.1:0", 2);
}

BOOST_AUTO_TEST_CASE(an_entry_larger_than_the_budget_is_granted_when_nothing_else_is_buffered) {
  runner r;
  server_options opt;
  opt.budget_bytes = 16 << 10;
  auto srv = server::listen(r.ex(), "inproc://server-test-big", opt).value();
  std::vector<seen> got;
  r.spawn(collect_into(srv, 1, got));
  std::error_code sent;
  r.spawn(send_into(srv.url(), {.who = 3, .blobs = 2, .entries = 2, .bytes = 64 << 10, .group = {}}, sent));
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  BOOST_TEST(!sent, sent.message());
  BOOST_TEST(count(got, server_event_kind::blob_complete) == 2u);
  const auto st = srv.stats();
  BOOST_TEST(st.pool.overcommits >= 4u);  // each 64 KiB entry, alone
  BOOST_TEST(st.pool.committed_high_water <= opt.budget_bytes + (64u << 10) + 1024u);
}

BOOST_AUTO_TEST_CASE(connections_beyond_the_cap_are_refused) {
  runner r;
  server_options opt;
  opt.max_connections = 2;
  auto srv = server::listen(r.ex(), "inproc://server-test-cap", opt).value();
  std::vector<sender> kept;
  auto start_one = [&]() -> asio::awaitable<std::error_code> {
    auto ex = co_await asio::this_coro::executor;
    auto [ec, t] = co_await blobpipe::connect(ex, srv.url());
    if (ec) co_return ec;
    auto [sec, s] = co_await sender::start(std::move(t));
    if (!sec) kept.push_back(std::move(s));
    co_return sec;
  };
  BOOST_TEST(!r.await(start_one()));
  BOOST_TEST(!r.await(start_one()));
  const auto third = r.await(start_one());
  BOOST_TEST((third == errc::peer_closed || third == errc::peer_failed), third.message());
  auto st = srv.stats();
  BOOST_TEST(st.accepted == 2u);
  BOOST_TEST(st.refused == 1u);
  BOOST_TEST(st.open == 2u);
  srv.close();
}

// Silent sockets and a slowloris (a hello's header and a few of its
// bytes, then nothing) take every slot; honest senders still get in and
// complete: the oldest connection still in its handshake gives way (no
// handshake timeout here, so nothing else frees a slot), and nobody is
// refused. A server whose full slots refused newcomers would refuse every
// honest sender ("no rank could be reached").
BOOST_AUTO_TEST_CASE(connections_still_in_their_handshake_give_way_to_honest_senders) {
  runner r;
  server_options opt;
  opt.max_connections = 4;
  opt.handshake_timeout = std::chrono::milliseconds(0);
  opt.connection.handshake_timeout = std::chrono::milliseconds(0);  // the consumer's own
  opt.connection.stall_timeout = std::chrono::milliseconds(0);      // a hello is owed: off
  auto srv = server::listen(r.ex(), "tcp://127.0.0.1:0", opt).value();
  std::vector<std::unique_ptr<transport>> hostile;
  for (int i = 0; i < 4; ++i) {
    auto [ec, t] = r.await(blobpipe::connect(r.ex(), srv.url()));
    BOOST_TEST_REQUIRE(!ec);
    if (i == 3) {  // the slowloris
      std::vector<std::byte> part(frame_header_size + 8);
      encode_frame_header({.type = frame_type::hello, .length = hello_size},
                          std::span(part).first<frame_header_size>());
      const std::array<asio::const_buffer, 1> b{asio::buffer(part)};
      BOOST_TEST_REQUIRE(!r.await(t->write(b)));
    }
    hostile.push_back(std::move(t));
  }
  // Every slot taken (the server accepts on its own time).
  auto open_is = [&](std::uint64_t n) -> asio::awaitable<bool> {
    asio::steady_timer tick(co_await asio::this_coro::executor);
    for (int i = 0; i < 20'000; ++i) {
      if (srv.stats().open == n) co_return true;
      tick.expires_after(std::chrono::milliseconds(1));
      co_await tick.async_wait(asio::use_awaitable);
    }
    co_return false;
  };
  BOOST_TEST_REQUIRE(r.await(open_is(4)));
  std::vector<seen> events;
  r.spawn(collect_into(srv, 2, events));
  // Both connected at once: each takes a silent one's slot.
  std::vector<sender> honest;
  for (int i = 0; i < 2; ++i) {
    auto [ec, s] = r.await(start_sender(srv.url()));
    BOOST_TEST_REQUIRE(!ec, ec.message());
    honest.push_back(std::move(s));
  }
  for (std::uint32_t who = 0; who < 2; ++who) {
    auto& s = honest[who];
    const auto ec = r.await(stream_blobs(s, {.who = who, .blobs = 2, .entries = 2, .bytes = 64, .group = {}}));
    BOOST_TEST(!ec, ec.message());
    const auto sec = r.await(s.shutdown());
    BOOST_TEST(!sec, sec.message());
  }
  // The two oldest silent ones were closed for them.
  for (int i = 0; i < 2; ++i) {
    std::array<std::byte, 1> b{};
    const auto rec = r.await(hostile[static_cast<std::size_t>(i)]->read_exact(b));
    BOOST_TEST((rec == errc::peer_closed), rec.message());
  }
  auto st = srv.stats();
  BOOST_TEST(st.refused == 0u);
  BOOST_TEST(st.handshake_failures == 2u);
  for (auto& t : hostile) t->close();
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(count(events, server_event_kind::blob_complete) == 4u);
  BOOST_TEST(all_bytes_ok(events));
}

// A connection costs nothing large before its handshake: a hello-sized
// receive buffer (4 KiB), the rest once the hello has come. With a full
// 256 KiB receive buffer each, 1,100 silent connections would hold
// 288 MB. The heap the server holds for 32 silent connections is counted
// (test/heap_counter).
BOOST_AUTO_TEST_CASE(silent_connections_hold_no_large_buffer) {
  if (!testing::detail::heap_counting()) BLOBPIPE_SKIP("this build cannot count the heap");
  runner r;
  server_options opt;
  opt.handshake_timeout = std::chrono::milliseconds(0);
  opt.connection.handshake_timeout = std::chrono::milliseconds(0);
  auto srv = server::listen(r.ex(), "tcp://127.0.0.1:0", opt).value();
  constexpr std::size_t n = 32;
  std::vector<std::unique_ptr<transport>> silent;
  const std::int64_t before = testing::detail::heap_live();
  for (std::size_t i = 0; i < n; ++i) {
    auto [ec, t] = r.await(blobpipe::connect(r.ex(), srv.url()));
    BOOST_TEST_REQUIRE(!ec);
    silent.push_back(std::move(t));
  }
  auto open_is = [&](std::uint64_t want) -> asio::awaitable<bool> {
    asio::steady_timer tick(co_await asio::this_coro::executor);
    for (int i = 0; i < 20'000; ++i) {
      if (srv.stats().open == want) co_return true;
      tick.expires_after(std::chrono::milliseconds(1));
      co_await tick.async_wait(asio::use_awaitable);
    }
    co_return false;
  };
  BOOST_TEST_REQUIRE(r.await(open_is(n)));
  const std::int64_t per_connection = (testing::detail::heap_live() - before) / std::int64_t{n};
  BOOST_TEST_MESSAGE(per_connection << " bytes of heap per silent connection");
  // Both ends of each connection are in this process: the server's state
  // and buffer, and the client transport.
  BOOST_TEST(per_connection < std::int64_t{64} << 10, per_connection << " bytes each");
  for (auto& t : silent) t->close();
  srv.close();
}

// server.hpp next(): a server that holds none (default-constructed, or
// moved from) yields end_of_stream with closed at once.
BOOST_AUTO_TEST_CASE(next_of_a_server_that_holds_none_is_closed) {
  runner r;
  auto listening = server::listen(r.ex(), "inproc://server-test-moved-from").value();
  server taken = std::move(listening);
  server_event from_moved, from_default;
  auto body = [&]() -> asio::awaitable<void> {
    from_moved = co_await listening.next();
    server none;
    from_default = co_await none.next();
    taken.close();
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run());
  for (const server_event* ev : {&from_moved, &from_default}) {
    BOOST_TEST((ev->ev.kind == event_kind::end_of_stream));
    BOOST_TEST((ev->ev.error == errc::closed), ev->ev.error.message());
  }
}

BOOST_AUTO_TEST_CASE(a_silent_connection_is_closed_at_the_handshake_timeout) {
  runner r;
  server_options opt;
  opt.handshake_timeout = std::chrono::milliseconds(20);
  // The consumer's own bounds off: only the server's handshake_timeout
  // closes the connection (with the consumer's 10 s handshake bound, or the
  // server's 60 s stall clock, the test passed without it).
  opt.connection.handshake_timeout = std::chrono::milliseconds(0);
  opt.connection.stall_timeout = std::chrono::milliseconds(0);
  opt.connection.idle_timeout = std::chrono::milliseconds(0);
  auto srv = server::listen(r.ex(), "inproc://server-test-silent", opt).value();
  auto [ec, t] = r.await(blobpipe::connect(r.ex(), srv.url()));
  BOOST_TEST_REQUIRE(!ec);
  // Ends when the server closes it; a hang guard 500 times the limit
  // closes it from this side instead (`closed`, not `peer_closed`), so a
  // server that never closes it fails here, not at Bazel's timeout.
  auto read_or_give_up = [&]() -> asio::awaitable<std::error_code> {
    asio::steady_timer guard(co_await asio::this_coro::executor, std::chrono::seconds(10));
    guard.async_wait([&t = *t](std::error_code e) {
      if (!e) t.close();
    });
    std::array<std::byte, 1> b{};
    const auto rec = co_await t->read_exact(b);
    guard.cancel();
    co_return rec;
  };
  const auto rec = r.await(read_or_give_up());
  BOOST_TEST((rec == errc::peer_closed),
             "not closed by the server within 10 s (handshake_timeout 20 ms): " << rec.message());
  auto st = srv.stats();
  BOOST_TEST(st.handshake_failures == 1u);
  BOOST_TEST(st.open == 0u);
  srv.stop_accepting();
  auto end = r.await(srv.next());
  BOOST_TEST(end.kind == server_event_kind::end_of_stream);  // it never opened: no events
}

// server_options::initial_grant_bytes and stream_bytes reach the pool: a
// new connection starts with min(initial_grant_bytes, budget / 16, its
// stream target among the open connections) of credit (credit_pool.hpp),
// committed once its handshake is done. The defaults (1 MiB each) would
// give 1 MiB in both cases.
BOOST_AUTO_TEST_CASE(a_new_connection_starts_with_initial_grant_bytes_within_its_stream_target) {
  runner r;
  auto first_grant = [&](server_options opt, const char* url) {
    auto srv = server::listen(r.ex(), url, opt).value();
    auto [ec, s] = r.await(start_sender(srv.url()));
    BOOST_TEST_REQUIRE(!ec, ec.message());
    const auto committed = srv.stats().pool.committed_bytes;
    srv.close();
    return committed;
  };
  server_options small_grant;
  small_grant.initial_grant_bytes = 4096;
  BOOST_TEST(first_grant(small_grant, "inproc://server-test-initial") == 4096u);
  server_options small_stream;
  small_stream.stream_bytes = 256 << 10;  // one connection's target: all of it
  BOOST_TEST(first_grant(small_stream, "inproc://server-test-stream") == 256u << 10);
}

BOOST_AUTO_TEST_CASE(drain_lets_an_open_blob_finish_then_closes) {
  runner r;
  auto srv = server::listen(r.ex(), "inproc://server-test-drain").value();
  gate drained(r.ex());
  std::vector<seen> got;
  std::error_code finished, after;
  auto application = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await srv.next();
      got.push_back(record(ev));
      if (ev.kind == server_event_kind::entry_ready && !drained.is_open()) {
        srv.drain();
        drained.open();
      }
      if (ev.kind == server_event_kind::end_of_stream) break;
    }
  };
  r.spawn(application());
  auto drained_sender = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    auto blob = s.open_blob(numbered_tag(1, 0));
    const auto x = fixture_bytes(1, 0, 0, 100);
    BLOBPIPE_CO_CHECK(blob.emit("e0", value::tensor(x)));
    co_await drained.wait();
    BLOBPIPE_CO_CHECK(blob.emit("e1", value::tensor(fixture_bytes(1, 0, 1, 100))));
    finished = co_await blob.finish();
    (void)co_await s.flush();  // the server may close as soon as the tail is in
    // The server closes the connection once the blob has ended.
    auto next = s.open_blob(numbered_tag(1, 1));
    const auto next_x = fixture_bytes(1, 1, 0, 100);
    for (int i = 0; i < 100 && !after; ++i) {
      after = co_await next.emit("e0", value::tensor(next_x));
      co_await yield_n(5);
    }
  };
  r.spawn(drained_sender());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  BOOST_TEST(!finished, finished.message());
  BOOST_TEST(after, "the sender could go on after the drain");
  BOOST_TEST(count(got, server_event_kind::blob_complete) == 1u);
  BOOST_TEST(count(got, server_event_kind::entry_ready) >= 2u);
  BOOST_TEST(got.back().kind == server_event_kind::end_of_stream);
}

namespace {

void close_case(const char* url, std::size_t threads) {
  runner r;
  server_options opt;
  opt.threads = threads;
  auto srv = server::listen(r.ex(), url, opt).value();
  gate begun(r.ex());
  std::vector<seen> got;
  std::uint64_t tasks_while_open = 0;
  std::uint64_t tasks_at_end = 1;
  auto application = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await srv.next();
      got.push_back(record(ev));
      if (ev.kind == server_event_kind::entry_ready && !tasks_while_open) {
        tasks_while_open = srv.stats().tasks_running;
        begun.open();
      }
      if (ev.kind == server_event_kind::end_of_stream) {
        tasks_at_end = srv.stats().tasks_running;
        break;
      }
    }
  };
  r.spawn(application());
  auto mid_blob_sender = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    auto blob = s.open_blob(numbered_tag(2, 0));
    const auto x = fixture_bytes(2, 0, 0, 100);
    const auto x1 = fixture_bytes(2, 0, 1, 100);
    BLOBPIPE_CO_CHECK(blob.emit("e0", value::tensor(x)));
    co_await begun.wait();
    srv.close();  // next() is pending in the other coroutine, or soon will be
    auto rest = co_await blob.emit("e1", value::tensor(x1));
    (void)rest;
  };
  r.spawn(mid_blob_sender());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  BOOST_TEST_REQUIRE(got.size() >= 4u);
  BOOST_TEST(count(got, server_event_kind::blob_aborted) == 1u);
  BOOST_TEST(got[got.size() - 2].kind == server_event_kind::connection_closed);
  BOOST_TEST(got.back().kind == server_event_kind::end_of_stream);
  BOOST_TEST((got.back().error == errc::closed));
  // The accept loop and the connection's pump ran, and had ended by the
  // end_of_stream: next() waits for the server's own tasks.
  BOOST_TEST(tasks_while_open >= 2u);
  BOOST_TEST(tasks_at_end == 0u);
  // And it stays ended.
  auto again = r.await(srv.next());
  BOOST_TEST(again.kind == server_event_kind::end_of_stream);
  BOOST_TEST(srv.stats().tasks_running == 0u);
}

}  // namespace

BOOST_AUTO_TEST_CASE(close_wakes_a_pending_next_with_the_open_blobs_aborted) {
  close_case("inproc://server-test-close", 1);
}

BOOST_AUTO_TEST_CASE(close_reaches_connections_on_receive_threads) {
  close_case("tcp://127.0.0.1:0", 2);
}

BOOST_AUTO_TEST_CASE(stats_json_is_one_line_with_the_counts) {
  runner r;
  auto srv = server::listen(r.ex(), "inproc://server-test-json").value();
  std::vector<seen> got;
  r.spawn(collect_into(srv, 1, got));
  auto one_sender = [&]() -> asio::awaitable<void> {
    BLOBPIPE_CO_CHECK(send_to(srv.url(), {.who = 4, .blobs = 3, .entries = 2, .bytes = 10, .group = {}}));
  };
  r.spawn(one_sender());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  const auto j = srv.stats_json();
  BOOST_TEST(j.find('\n') == std::string::npos);
  BOOST_TEST(j.starts_with("{\"role\":\"server\",\"accepted\":1,"));
  BOOST_TEST(j.find("\"total\":{\"bytes\":60,\"entries\":6,\"blobs\":3,\"aborts\":0,") !=
                 std::string::npos,
             j);
  BOOST_TEST(j.find("\"latency_ms\":{\"count\":6,") != std::string::npos, j);
}

namespace {

/// Where the first event of `kind` for group `id` is in `v` (v.size(): none).
std::size_t index_of_group(const std::vector<seen>& v, server_event_kind kind, std::uint64_t id) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i].kind == kind && v[i].group && v[i].group->id == id) return i;
  return v.size();
}

std::size_t count_group(const std::vector<seen>& v, server_event_kind kind, std::uint64_t id) {
  std::size_t n = 0;
  for (const auto& s : v) n += s.kind == kind && s.group && s.group->id == id;
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_group_from_two_connections_completes_after_its_last_member) {
  runner r;
  auto srv = server::listen(r.ex(), "inproc://server-test-group").value();
  std::vector<seen> got;
  r.spawn(collect_into(srv, 2, got));
  std::error_code a, b;
  // Group 7 has four members: two from each sender; group 8 (one member)
  // rides along on sender 2's connection.
  r.spawn(send_into(srv.url(), {.who = 1, .blobs = 2, .entries = 2, .bytes = 100, .group = blob_group{7, 4}}, a));
  auto second = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    b = co_await stream_blobs(s, {.who = 2, .blobs = 2, .entries = 2, .bytes = 100, .group = blob_group{7, 4}});
    if (!b) b = co_await stream_blobs(s, {.who = 3, .blobs = 1, .entries = 1, .bytes = 10, .group = blob_group{8, 1}});
    if (!b) b = co_await s.shutdown();
  };
  r.spawn(second());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  BOOST_TEST(!a, a.message());
  BOOST_TEST(!b, b.message());
  BOOST_TEST(count_group(got, server_event_kind::group_complete, 7) == 1u);
  BOOST_TEST(count_group(got, server_event_kind::group_complete, 8) == 1u);
  BOOST_TEST(count(got, server_event_kind::group_aborted) == 0u);
  // Every member's blob_complete came first, from both connections.
  const std::size_t done = index_of_group(got, server_event_kind::group_complete, 7);
  std::set<std::uint64_t> conns;
  std::size_t members = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i].kind != server_event_kind::blob_complete || got[i].group->id != 7) continue;
    BOOST_TEST(i < done, "member " << i << " completed after its group");
    BOOST_TEST(got[i].group->size == 4u);
    conns.insert(got[i].conn);
    ++members;
  }
  BOOST_TEST(members == 4u);
  BOOST_TEST(conns.size() == 2u);
  BOOST_TEST_REQUIRE(done < got.size());
  BOOST_TEST(got[done].conn == 0u);  // a group's event names no connection
  const auto st = srv.stats();
  BOOST_TEST(st.groups_complete == 2u);
  BOOST_TEST(st.groups_aborted == 0u);
  BOOST_TEST(st.groups_open == 0u);
  BOOST_TEST(st.late_members == 0u);
}

BOOST_AUTO_TEST_CASE(a_member_aborting_aborts_its_group_at_once_and_later_members_are_late) {
  runner r;
  auto srv = server::listen(r.ex(), "inproc://server-test-group-abort").value();
  gate group_ended(r.ex());
  std::vector<seen> got;
  std::size_t closed = 0;
  auto application = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await srv.next();
      got.push_back(record(ev));
      if (ev.kind == server_event_kind::group_aborted) group_ended.open();
      if (ev.kind == server_event_kind::connection_closed && ++closed == 2) srv.stop_accepting();
      if (ev.kind == server_event_kind::end_of_stream) break;
    }
  };
  r.spawn(application());
  const blob_group g{9, 3};
  // Sender 1: one member complete; after the group ended, a late one.
  auto first = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    BLOBPIPE_CO_CHECK(stream_blobs(s, {.who = 1, .blobs = 1, .entries = 1, .bytes = 10, .group = g}));
    co_await group_ended.wait();
    BLOBPIPE_CO_CHECK(stream_blobs(s, {.who = 11, .blobs = 1, .entries = 2, .bytes = 10, .group = g}));
    BLOBPIPE_CO_CHECK(s.shutdown());
  };
  // Sender 2: a member that aborts after one entry.
  auto second = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    auto blob = s.open_blob(blob_options{.tag = numbered_tag(2, 0), .group = g});
    const auto x = fixture_bytes(2, 0, 0, 10);
    BLOBPIPE_CO_CHECK(blob.emit("e0", value::tensor(x)));
    BLOBPIPE_CO_CHECK(blob.abort("the rollout failed"));
    BLOBPIPE_CO_CHECK(s.shutdown());
  };
  r.spawn(first());
  r.spawn(second());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  BOOST_TEST(count_group(got, server_event_kind::group_aborted, 9) == 1u);
  BOOST_TEST(count_group(got, server_event_kind::group_complete, 9) == 0u);
  const std::size_t aborted = index_of_group(got, server_event_kind::group_aborted, 9);
  const std::size_t member = index_of_group(got, server_event_kind::blob_aborted, 9);
  BOOST_TEST_REQUIRE(aborted < got.size());
  BOOST_TEST(member + 1 == aborted, "the group ends right after its member's abort");
  BOOST_TEST((got[aborted].error == errc::aborted), got[aborted].error.message());
  // The late member still streams (entries and its blob_complete).
  BOOST_TEST(count_group(got, server_event_kind::blob_complete, 9) == 2u);
  const auto st = srv.stats();
  BOOST_TEST(st.groups_aborted == 1u);
  BOOST_TEST(st.groups_open == 0u);
  BOOST_TEST(st.late_members == 1u);
  // The metrics count what next() yielded.
  BOOST_TEST(st.total.entries == count(got, server_event_kind::entry_ready));
  BOOST_TEST(st.total.bytes == 10u * count(got, server_event_kind::entry_ready));
  BOOST_TEST(st.total.blobs == 2u);
  BOOST_TEST(st.total.aborts == 1u);
}

BOOST_AUTO_TEST_CASE(a_group_missing_members_is_aborted_at_its_timeout) {
  runner r;
  server_options opt;
  opt.group_timeout = std::chrono::milliseconds(20);
  auto srv = server::listen(r.ex(), "inproc://server-test-group-timeout", opt).value();
  gate group_ended(r.ex());
  std::vector<seen> got;
  auto application = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await srv.next();
      got.push_back(record(ev));
      if (ev.kind == server_event_kind::group_aborted) group_ended.open();
      if (ev.kind == server_event_kind::connection_closed) srv.stop_accepting();
      if (ev.kind == server_event_kind::end_of_stream) break;
    }
  };
  r.spawn(application());
  // One member of two; the connection stays open until the group ends
  // (so the end is the timeout's, not the last connection's).
  auto one_member = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    BLOBPIPE_CO_CHECK(stream_blobs(s, {.who = 1, .blobs = 1, .entries = 1, .bytes = 10, .group = blob_group{5, 2}}));
    co_await group_ended.wait();
    BLOBPIPE_CO_CHECK(s.shutdown());
  };
  r.spawn(one_member());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  const std::size_t aborted = index_of_group(got, server_event_kind::group_aborted, 5);
  BOOST_TEST_REQUIRE(aborted < got.size());
  BOOST_TEST((got[aborted].error == errc::timed_out), got[aborted].error.message());
  std::size_t closed = 0;
  while (closed < got.size() && got[closed].kind != server_event_kind::connection_closed) ++closed;
  BOOST_TEST(aborted < closed, "the group ended with the connection, not at its timeout");
  BOOST_TEST(srv.stats().groups_aborted == 1u);
}

BOOST_AUTO_TEST_CASE(sender_and_server_count_the_same_entries_blobs_and_aborts) {
  runner r;
  auto srv = server::listen(r.ex(), "inproc://server-test-metrics").value();
  std::vector<seen> got;
  r.spawn(collect_into(srv, 1, got));
  std::string sender_json;
  sender_stats sent;
  const auto first_entry_after = std::chrono::milliseconds(50);
  auto one_sender = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    // The first entry comes at least this long after the connection.
    asio::steady_timer pause(co_await asio::this_coro::executor, first_entry_after);
    co_await pause.async_wait(asio::use_awaitable);
    BLOBPIPE_CO_CHECK(stream_blobs(s, {.who = 5, .blobs = 3, .entries = 2, .bytes = 1000, .group = {}}));
    auto dropped = s.open_blob(numbered_tag(6, 0));
    const auto x = fixture_bytes(6, 0, 0, 1000);
    BLOBPIPE_CO_CHECK(dropped.emit("e0", value::tensor(x)));
    BLOBPIPE_CO_CHECK(dropped.abort("dropped"));
    BLOBPIPE_CO_CHECK(s.shutdown());
    sent = s.stats();
    sender_json = to_json(sent, 1);
  };
  r.spawn(one_sender());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  const auto got_st = srv.stats();
  const auto sent_m = metrics_of(sent);
  BOOST_TEST(sent_m.entries == 7u);
  BOOST_TEST(sent_m.bytes == sent.bytes_sent);
  BOOST_TEST(sent.bytes_sent >= 7u * 1000u);  // seven entries of 1,000 bytes, and the tails
  BOOST_TEST(sent_m.blobs == 3u);
  BOOST_TEST(sent_m.aborts == 1u);
  BOOST_TEST(!sent_m.first_entry_s.has_value());  // no start time given
  BOOST_TEST(got_st.total.entries == count(got, server_event_kind::entry_ready));
  BOOST_TEST(got_st.total.entries >= 6u);  // the aborted blob's entry may not have been yielded
  BOOST_TEST(got_st.total.blobs == 3u);
  BOOST_TEST(got_st.total.aborts == 1u);
  BOOST_TEST(got_st.total.latency.count() == got_st.total.entries);
  BOOST_TEST_REQUIRE(got_st.total.first_entry_s.has_value());
  // Seconds from the connection, which no clock makes shorter than the pause.
  BOOST_TEST(*got_st.total.first_entry_s >= 0.05, *got_st.total.first_entry_s);
  BOOST_TEST(sender_json.find('\n') == std::string::npos);
  BOOST_TEST(sender_json.starts_with("{\"role\":\"sender\",\"total\":{\"bytes\":"), sender_json);
  BOOST_TEST(sender_json.find("\"entries\":7,\"blobs\":3,\"aborts\":1,") != std::string::npos,
             sender_json);
}

// The sender-stall clock runs only while the sender holds credit it could
// send on: an application that holds the budget (no held allowance here)
// for several stall timeouts, while the sender waits for credit with its
// blob open, does not get the sender's connection closed as stalled. Once
// the application lets go, the blob completes. (The wait is a span the
// clock would have tripped in, not a timing assertion.)
BOOST_AUTO_TEST_CASE(an_application_holding_the_budget_is_never_blamed_on_the_sender) {
  runner r;
  server_options opt;
  opt.budget_bytes = 48 << 10;
  opt.initial_grant_bytes = 48 << 10;
  opt.connection.stall_timeout = std::chrono::milliseconds(100);
  opt.connection.held_bytes = 0;      // held entries keep their credit
  opt.connection.held_timeout = {};   // and the application is never timed
  auto srv = server::listen(r.ex(), "inproc://server-test-held", opt).value();
  std::error_code sent;
  std::vector<server_event> closed;
  int complete = 0;
  std::uint64_t waits = 0;
  auto application = [&]() -> asio::awaitable<void> {
    std::vector<std::shared_ptr<const received_entry>> held;
    asio::steady_timer later(r.ex());
    for (;;) {
      auto ev = co_await srv.next();
      if (ev.kind == server_event_kind::entry_ready) {
        held.push_back(ev.ev.entry);
        if (held.size() == 2) {
          // The sender now waits for credit the application holds.
          later.expires_after(std::chrono::milliseconds(1000));  // 10 stall timeouts
          co_await later.async_wait(asio::use_awaitable);
          waits = srv.stats().total.credit_waits;
          held.clear();
        }
      }
      if (ev.kind == server_event_kind::blob_complete) ++complete;
      if (ev.kind == server_event_kind::connection_closed) {
        closed.push_back(ev);
        srv.stop_accepting();
      }
      if (ev.kind == server_event_kind::end_of_stream) break;
    }
  };
  r.spawn(application());
  r.spawn(send_into(srv.url(), {.who = 1, .blobs = 1, .entries = 4, .bytes = 16 << 10, .group = {}},
                    sent));
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(!sent, sent.message());
  BOOST_TEST(complete == 1);
  BOOST_TEST_REQUIRE(closed.size() == 1u);
  BOOST_TEST(!closed[0].ev.error, closed[0].ev.error.message() << ": " << closed[0].ev.reason);
  BOOST_TEST(waits > 0u);  // the sender did wait for the credit held
}

// An application that holds a whole blob larger than the budget (a group's
// members, gathered before training) until it completes: the entries it
// holds leave the budget for the connection's held allowance, so the
// sender goes on and the blob completes. Without the allowance the sender
// would wait for the budget the application holds; held_timeout turns
// that into timed_out here, so a regression fails instead of hanging.
BOOST_AUTO_TEST_CASE(an_application_holding_more_than_the_budget_completes_within_its_allowance) {
  runner r;
  server_options opt;
  opt.budget_bytes = 48 << 10;
  opt.connection.held_bytes = 256 << 10;
  opt.connection.held_timeout = std::chrono::seconds(5);
  auto srv = server::listen(r.ex(), "inproc://server-test-held-allowance", opt).value();
  std::error_code sent;
  std::vector<server_event> closed;
  std::size_t held_at_complete = 0;
  int complete = 0;
  auto application = [&]() -> asio::awaitable<void> {
    std::vector<std::shared_ptr<const received_entry>> held;  // the whole blob
    for (;;) {
      auto ev = co_await srv.next();
      if (ev.kind == server_event_kind::entry_ready) held.push_back(ev.ev.entry);
      if (ev.kind == server_event_kind::blob_complete) {
        ++complete;
        held_at_complete = held.size();
        held.clear();
      }
      if (ev.kind == server_event_kind::connection_closed) {
        closed.push_back(ev);
        srv.stop_accepting();
      }
      if (ev.kind == server_event_kind::end_of_stream) break;
    }
  };
  r.spawn(application());
  r.spawn(send_into(srv.url(), {.who = 1, .blobs = 2, .entries = 8, .bytes = 16 << 10, .group = {}},
                    sent));
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(!sent, sent.message());
  BOOST_TEST(complete == 2);
  BOOST_TEST(held_at_complete == 8u);  // 128 KiB held at once, against a 48 KiB budget
  BOOST_TEST_REQUIRE(closed.size() == 1u);
  BOOST_TEST(!closed[0].ev.error, closed[0].ev.error.message() << ": " << closed[0].ev.reason);
  const auto st = srv.stats();
  BOOST_TEST(st.pool.committed_high_water <= opt.budget_bytes);  // the budget held
}

// held_timeout runs only while the application waits (consumer_options::
// waits_reported): next() tells each connection whose entries it handed
// out when it waits again, with one receive thread or two. Here the
// application keeps every entry (no held allowance) and waits for more
// while the sender waits for the credit it holds: the connection ends
// with timed_out naming held_timeout. Were the wait not told, the held
// clock would never run and the sender would end at its own stall_timeout
// instead.
BOOST_AUTO_TEST_CASE(held_timeout_runs_while_the_application_waits_holding_entries) {
  for (std::size_t threads : {1u, 2u}) {
    BOOST_TEST_CONTEXT("threads " << threads) {
      runner r;
      server_options opt;
      opt.threads = threads;
      opt.budget_bytes = 48 << 10;
      opt.initial_grant_bytes = 48 << 10;
      opt.connection.held_bytes = 0;  // held entries keep their credit
      opt.connection.held_timeout = std::chrono::milliseconds(200);
      auto srv = server::listen(r.ex(), "inproc://server-test-held-waits-" + std::to_string(threads),
                                opt).value();
      std::error_code sent;
      std::vector<server_event> closed;
      auto application = [&]() -> asio::awaitable<void> {
        std::vector<std::shared_ptr<const received_entry>> held;  // never dropped
        for (;;) {
          auto ev = co_await srv.next();
          if (ev.kind == server_event_kind::entry_ready) held.push_back(ev.ev.entry);
          if (ev.kind == server_event_kind::connection_closed) {
            closed.push_back(ev);
            srv.stop_accepting();
          }
          if (ev.kind == server_event_kind::end_of_stream) break;
        }
      };
      sender_options sopt;
      sopt.stall_timeout = std::chrono::seconds(5);  // the mutant's end, not this test's
      r.spawn(application());
      r.spawn(send_into(srv.url(),
                        {.who = 1, .blobs = 1, .entries = 8, .bytes = 16 << 10, .group = {}}, sent,
                        sopt));
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST_REQUIRE(closed.size() == 1u);
      BOOST_TEST((closed[0].ev.error == errc::timed_out), closed[0].ev.error.message());
      BOOST_TEST(closed[0].ev.reason.find("(held_timeout)") != std::string::npos,
                 closed[0].ev.reason);
      BOOST_TEST((sent == errc::peer_closed), sent.message());
    }
  }
}

// server::start refuses options it cannot run with (server.hpp): no
// budget, no connection slot, no receive thread; each names them.
BOOST_AUTO_TEST_CASE(options_a_server_cannot_run_with_are_refused) {
  runner r;
  for (int which = 0; which < 3; ++which) {
    server_options opt;
    if (which == 0) opt.budget_bytes = 0;
    if (which == 1) opt.max_connections = 0;
    if (which == 2) opt.threads = 0;
    auto srv = server::listen(r.ex(), "inproc://server-test-bad-options-" + std::to_string(which), opt);
    BOOST_TEST_REQUIRE(!srv.has_value(), "option set " << which << " was accepted");
    BOOST_TEST((srv.code() == errc::invalid_argument), srv.message());
    BOOST_TEST(srv.message().find("threads 0") != std::string::npos, srv.message());
  }
}

BOOST_AUTO_TEST_CASE(a_queue_bound_of_zero_events_is_refused) {
  runner r;
  server_options opt;
  opt.max_queued_events_per_connection = 0;  // no connection could yield an event
  auto srv = server::listen(r.ex(), "inproc://server-test-bad-queue-bound", opt);
  BOOST_TEST_REQUIRE(!srv.has_value(), "a bound of 0 was accepted");
  BOOST_TEST((srv.code() == errc::invalid_argument), srv.message());
  BOOST_TEST(srv.message().find("max_queued_events_per_connection") != std::string::npos,
             srv.message());
}

// ---- fair turns: docs/cluster.md "Fair turns" -----------------------------

namespace {

constexpr std::uint32_t flood_who = 9;
constexpr std::uint32_t steady_who = 4;
constexpr int steady_blobs = 200;
constexpr std::size_t flood_batch = 4096;  // begin+abort pairs per write: 256 KiB

/// Writes `o` in one write.
asio::awaitable<std::error_code> write_outbox(transport& t, const outbox& o) {
  std::vector<asio::const_buffer> bufs;
  for (const auto& p : o.pieces()) {
    const auto b = p.bytes(o);
    bufs.emplace_back(b.data(), b.size());
  }
  co_return co_await t.write(std::span(bufs.data(), bufs.size()));
}

/// Reads and drops what the server sends (its hello, acks) until the
/// connection ends: an in-process write waits until it is read.
asio::awaitable<void> drop_replies(std::shared_ptr<transport> t) {
  std::vector<std::byte> buf(64 << 10);
  for (;;) {
    auto [ec, got] = co_await t->read_some(buf);
    if (ec) co_return;
  }
}

/// Connects a hand-driven sender (hello offering credit grants, written
/// without waiting for the reply) and starts dropping its replies.
asio::awaitable<std::shared_ptr<transport>> raw_sender(std::string url) {
  auto ex = co_await asio::this_coro::executor;
  auto [ec, t] = co_await blobpipe::connect(ex, url);
  BOOST_TEST_REQUIRE(!ec, ec.message());
  std::shared_ptr<transport> shared(std::move(t));
  asio::co_spawn(ex, drop_replies(shared), asio::detached);
  outbox o;
  frame_hello(o, hello{.role = wire_role::sender, .features = feature_credit_grants});
  BOOST_TEST_REQUIRE(!(co_await write_outbox(*shared, o)));
  co_return shared;
}

/// The steady sender: steady_blobs blobs of one 64-byte entry (key "e0",
/// fixture_bytes), each blob in a write of its own, then a close frame.
asio::awaitable<void> steady_sender(std::string url, std::error_code& result) {
  auto t = co_await raw_sender(url);
  for (int k = 0; k < steady_blobs; ++k) {
    const auto kk = static_cast<std::uint32_t>(k);
    const tag_t tag = numbered_tag(steady_who, kk);
    const auto bytes = fixture_bytes(steady_who, kk, 0, 64);
    layout_builder b;
    const planned_entry* pe = b.add("e0", value::tensor(bytes)).value();
    outbox o;
    const std::uint64_t id = kk + 1;
    frame_blob_begin(o, id, tag);
    frame_entry_begin(o, id, 0, pe->entry, pe->entry.meta());
    frame_data(o, id, pe->entry.off, std::as_bytes(std::span(bytes)), default_chunk_bytes, true);
    const auto plan = b.finish(tag).value();
    std::vector<std::byte> tail(tail_size(plan));
    BOOST_TEST_REQUIRE(write_tail(plan, tail).has_value());
    frame_tail(o, id, tail);
    if ((result = co_await write_outbox(*t, o))) co_return;
  }
  outbox bye;
  frame_close(bye, "done");
  result = co_await write_outbox(*t, bye);
}

/// The flood: begin+abort pairs of empty blobs, flood_batch per write,
/// until the server ends the connection.
asio::awaitable<void> flood_sender(std::string url, std::uint64_t& pairs) {
  auto t = co_await raw_sender(url);
  outbox o;
  for (;;) {
    o.clear();
    for (std::size_t i = 0; i < flood_batch; ++i) {
      ++pairs;
      frame_blob_begin(o, pairs, numbered_tag(flood_who, static_cast<std::uint32_t>(pairs)));
      frame_blob_abort(o, pairs, "");
    }
    if (co_await write_outbox(*t, o)) co_return;
  }
}

/// Records the server's events until the steady sender's connection
/// closes, then closes the server (ending the flood) and drains it.
asio::awaitable<void> record_until_steady_closes(server& srv, std::vector<seen>& out) {
  std::uint64_t steady = 0;
  bool closing = false;
  for (;;) {
    auto ev = co_await srv.next();
    if (ev.kind == server_event_kind::end_of_stream) co_return;
    auto s = record(ev);
    if (s.kind == server_event_kind::entry_ready && tag_sender(s.tag) == steady_who) steady = s.conn;
    if (s.kind == server_event_kind::connection_closed && s.conn == steady && !closing) {
      closing = true;
      srv.close();
    }
    out.push_back(std::move(s));
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_begin_abort_flood_gets_one_turn_per_turn_of_an_honest_sender) {
  // One connection floods begin+abort pairs (64 bytes a pair, 4,096 to a
  // 256 KiB read) while a steady sender streams 200 small blobs, one write
  // each, both on the server's one thread. A turn is a receive buffer's
  // worth of work, each frame counted as at least 4 KiB: at most 64 frames,
  // 32 of the flood's aborts, after which the connection yields. Between
  // two events of the steady sender the flood gets the turns that pass
  // while the steady sender's next write arrives (a few handler runs),
  // never a buffer of 2,048 to 4,096 aborts at once as a turn of one whole
  // read would. Counted in events, in the order the server yields them: no
  // clock.
  runner r;
  server_options opt;
  opt.threads = 1;  // both connections' turns on one thread, in order
  // The per-connection event bound alone would pace the flood (its pump
  // waits for room after 64 events): lifted here, so the turns are what
  // is tested.
  opt.max_queued_events_per_connection = std::size_t{1} << 20;
  auto srv = server::listen(r.ex(), "inproc://server-test-flood", opt).value();
  std::vector<seen> got;
  std::error_code steady_sent = make_error_code(errc::aborted);
  std::uint64_t flood_pairs = 0;
  r.spawn(record_until_steady_closes(srv, got));
  r.spawn(steady_sender(srv.url(), steady_sent));
  r.spawn(flood_sender(srv.url(), flood_pairs));
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(60)), "hung");
  BOOST_TEST(!steady_sent, steady_sent.message());
  // The steady sender completes with its data.
  std::size_t complete = 0;
  std::uint64_t steady = 0;
  for (const auto& s : got)
    if (s.kind == server_event_kind::blob_complete && tag_sender(s.tag) == steady_who) {
      ++complete;
      steady = s.conn;
    }
  BOOST_TEST(complete == std::size_t(steady_blobs));
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  // The flood's aborts between two consecutive events of the steady
  // sender's blobs (entry_ready, blob_complete).
  std::size_t gap = 0, worst = 0, flood_during = 0, steady_events = 0;
  for (const auto& s : got) {
    const bool steady_blob_event = s.conn == steady && (s.kind == server_event_kind::entry_ready ||
                                                        s.kind == server_event_kind::blob_complete);
    if (steady_blob_event) {
      if (steady_events++ > 0) {
        worst = std::max(worst, gap);
        flood_during += gap;
      }
      gap = 0;
    } else if (s.kind == server_event_kind::blob_aborted && tag_sender(s.tag) == flood_who) {
      ++gap;
    }
  }
  BOOST_TEST_MESSAGE("flood: " << flood_pairs << " pairs written, " << flood_during
                               << " aborts between the steady sender's events, at most "
                               << worst << " between two");
  BOOST_TEST(steady_events == std::size_t(2 * steady_blobs));
  // The flood ran all along (it is not starved: its fair share is a turn
  // per turn of the steady sender) ...
  BOOST_TEST(flood_during >= std::size_t(steady_blobs));
  // ... and between two of the steady sender's events it got at most four
  // turns of 32 aborts each.
  BOOST_TEST(worst <= 4u * 32u);
  BOOST_TEST(srv.stats().handshake_failures == 0u);
}

// At the end of the server's stream no connection stays listed: each one
// that ended is retired (its consumer released), its figures kept in the
// totals. Here the application holds every entry until both connections
// have closed, so each connection still holds credit when its last event
// is yielded, and lets go of them all only before the stream's end.
BOOST_AUTO_TEST_CASE(at_the_end_of_the_stream_no_ended_connection_stays_listed) {
  runner r;
  auto srv = server::listen(r.ex(), "inproc://server-end-retires").value();
  std::size_t entries = 0, closed = 0, listed_before_release = 0;
  auto consume = [&]() -> asio::awaitable<void> {
    std::vector<server_event> held;
    for (;;) {
      auto ev = co_await srv.next();
      if (ev.kind == server_event_kind::end_of_stream) break;
      if (ev.kind == server_event_kind::entry_ready) ++entries;
      const bool last = ev.kind == server_event_kind::connection_closed && ++closed == 2;
      held.push_back(std::move(ev));
      if (last) {
        listed_before_release = srv.stats().connections.size();
        held.clear();  // every entry let go; no event follows but the end
        srv.stop_accepting();
      }
    }
  };
  r.spawn(consume());
  std::error_code first, second;
  r.spawn(send_into(srv.url(), {.who = 1, .blobs = 3, .entries = 2, .bytes = 300, .group = {}},
                    first));
  r.spawn(send_into(srv.url(), {.who = 2, .blobs = 3, .entries = 2, .bytes = 300, .group = {}},
                    second));
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(!first, first.message());
  BOOST_TEST(!second, second.message());
  BOOST_TEST(entries == 12u);
  BOOST_TEST(listed_before_release == 2u, "the connections holding entries were not listed");
  const auto st = srv.stats();
  BOOST_TEST(st.connections.empty(), st.connections.size() << " connections still listed");
  BOOST_TEST(st.total.entries == 12u);
  BOOST_TEST(st.total.blobs == 6u);
}
