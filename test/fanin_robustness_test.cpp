// The fan-in server under one hostile connection (docs/reliability.md
// "Fan-in under a hostile sender"): each case runs an honest sender in
// another process (this binary again, TCP loopback) while a hostile peer,
// speaking the wire protocol by hand on the server's executor, asks for
// more credit than it may have or holds what it got. Each case checks that
// the honest sender completes with its data and that the credit committed
// stays within budget_bytes + the largest item's credit (credit_pool's
// stated bound). //test:fanin_robustness_threads_test runs every case again
// with the server's connections on two receive threads
// (BLOBPIPE_SERVER_THREADS=2: server_options::threads), the hostile and the
// honest connection on different threads.
#define BOOST_TEST_MODULE fanin_robustness_test
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <optional>
#include <cstdlib>
#include <thread>

#include <asio/steady_timer.hpp>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "test/cluster_fixture.hpp"
#include "test/frame_io.hpp"
#include "test/process.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

constexpr std::uint64_t budget = 4u << 20;
constexpr std::uint64_t max_entry = 1u << 20;
constexpr std::uint32_t max_tail = 64u << 10;
constexpr std::uint32_t honest_who = 1;
constexpr int honest_blobs = 40;

/// The server's receive threads: BLOBPIPE_SERVER_THREADS, else 1.
std::size_t server_threads() {
  const char* v = std::getenv("BLOBPIPE_SERVER_THREADS");
  const long n = v ? std::strtol(v, nullptr, 10) : 1;
  return n >= 1 ? static_cast<std::size_t>(n) : 1;
}

server_options hostile_case_options() {
  server_options o;
  o.threads = server_threads();
  o.budget_bytes = budget;
  o.connection.max_entry_bytes = max_entry;
  o.connection.max_tail_bytes = max_tail;
  o.connection.stall_timeout = std::chrono::milliseconds(300);
  return o;
}

/// The most credit one item can need: entry_credit of the largest entry,
/// key and meta (the tail limit is smaller here).
std::uint64_t max_item(const server_options& o) {
  return entry_credit(o.connection.max_entry_bytes, o.connection.max_key_bytes,
                      o.connection.max_meta_bytes);
}

/// The server's stated bound: the budget plus one item's credit.
std::uint64_t bound(const server_options& o) { return o.budget_bytes + max_item(o); }

asio::awaitable<std::error_code> send_out(transport& t, const outbox& out) {
  std::vector<asio::const_buffer> bufs;
  for (const auto& p : out.pieces()) {
    const auto b = p.bytes(out);
    bufs.emplace_back(b.data(), b.size());
  }
  co_return co_await t.write(std::span(bufs.data(), bufs.size()));
}

/// A hand-driven sender: hello offering credit grants, then frames.
struct hostile {
  std::unique_ptr<transport> t;
  frame_reader reader;
  std::uint64_t granted = 0;  // initial window + grants
  std::uint32_t chunk = 0;

  asio::awaitable<void> start(std::string url) {
    auto ex = co_await asio::this_coro::executor;
    auto [ec, tr] = co_await blobpipe::connect(ex, url);
    BOOST_TEST_REQUIRE(!ec);
    t = std::move(tr);
    outbox out;
    frame_hello(out, hello{.role = wire_role::sender, .features = feature_credit_grants});
    BOOST_TEST_REQUIRE(!(co_await send_out(*t, out)));
    auto [hec, f] = co_await reader.next(*t);
    BOOST_TEST_REQUIRE(!hec);
    auto h = decode_hello(f.payload);
    BOOST_TEST_REQUIRE(h.has_value());
    BOOST_TEST_REQUIRE((h->features & feature_credit_grants) != 0u);
    granted = h->window_bytes;
    chunk = h->max_chunk_bytes;
  }
  asio::awaitable<std::error_code> request(std::uint64_t credit) {
    outbox out;
    frame_credit_request(out, credit);
    co_return co_await send_out(*t, out);
  }
  /// Reads grants until `at_least` credit in all; false if the
  /// connection ended first.
  asio::awaitable<bool> await_credit(std::uint64_t at_least) {
    while (granted < at_least) {
      auto [ec, f] = co_await reader.next(*t);
      if (ec) co_return false;
      if (f.header.type == frame_type::ack) granted += f.header.arg;
    }
    co_return true;
  }
  /// Reads (grants) until the server ends the connection.
  asio::awaitable<void> until_closed() {
    for (;;) {
      auto [ec, f] = co_await reader.next(*t);
      if (ec) co_return;
      if (f.header.type == frame_type::ack) granted += f.header.arg;
    }
  }
};

/// An entry of `len` bytes, key "x", as a sender announces it.
struct big_entry {
  std::vector<std::uint8_t> bytes;
  layout_builder lb;
  const planned_entry* pe = nullptr;
  std::vector<std::byte> meta;
  explicit big_entry(std::size_t len) : bytes(len, 0x5a) {
    pe = *lb.add("x", value::tensor(bytes));
    meta = pe->entry.meta();
  }
  std::uint64_t credit() const { return entry_credit(pe->entry.len, 1, meta.size()); }
  std::span<const std::byte> data() const { return std::as_bytes(std::span(bytes)); }
};

/// The honest sender's work: honest_blobs blobs of 3 entries of 32 KiB to
/// `url`, on an io_context of its own; what its sender reported.
std::error_code send_honestly(const std::string& url) {
  asio::io_context ctx;
  std::error_code result = make_error_code(errc::aborted);  // until it reports
  asio::co_spawn(ctx,
                 send_to(url, {.who = honest_who, .blobs = honest_blobs, .entries = 3,
                               .bytes = 32u << 10, .group = {}}),
                 [&result](std::exception_ptr e, std::error_code ec) {
                   result = e ? make_error_code(errc::aborted) : ec;
                 });
  ctx.run();
  return result;
}

/// This test binary run again with BLOBPIPE_HONEST_SENDER=URL is the
/// honest sender, in a process of its own as a cluster's senders are:
/// before any test case, it sends and exits, 0 when its sender finished
/// cleanly, else 1 with the error on stderr.
struct honest_sender_process_main {
  honest_sender_process_main() {
    const char* url = std::getenv("BLOBPIPE_HONEST_SENDER");
    if (!url) return;
    const std::error_code ec = send_honestly(url);
    if (ec) std::fprintf(stderr, "honest sender: %s\n", ec.message().c_str());
    std::fflush(nullptr);
    std::_Exit(ec ? 1 : 0);
  }
};
BOOST_TEST_GLOBAL_FIXTURE(honest_sender_process_main);

/// The honest sender in a process of its own (this binary again, TCP).
class honest_process {
 public:
  void start(std::string url) {
    proc_.emplace("/proc/self/exe", std::vector<std::string>{}, std::nullopt,
                  std::vector<std::string>{"BLOBPIPE_HONEST_SENDER=" + url});
  }
  /// Waits for it to end (a hang bound of 60 s, not a timing assertion: its
  /// sender's own timeouts end it first); what it reported.
  std::error_code join() {
    if (!proc_) return result_;
    proc_->wait_for_stdout([](const std::string&) { return false; }, std::chrono::seconds(60));
    proc_->signal(SIGKILL);  // ended already (a zombie ignores it), or hung
    const run_result r = proc_->wait();
    proc_.reset();
    if (r.exit_code != 0)
      BOOST_TEST_MESSAGE("the honest sender process exited " << r.exit_code << ": " << r.err);
    result_ = r.exit_code == 0 ? std::error_code{} : make_error_code(errc::aborted);
    return result_;
  }
  ~honest_process() { join(); }

 private:
  std::optional<process> proc_;
  std::error_code result_ = make_error_code(errc::aborted);  // until it reports
};

/// What the application saw, per connection.
struct outcome {
  std::vector<seen> events;
  std::uint64_t worst_committed = 0;
  std::uint64_t honest_conn = 0;
  std::size_t honest_blobs_complete = 0;
  std::error_code hostile_error;
  std::string hostile_reason;
  std::vector<std::string> closed_reasons;  // every connection_closed's
};

/// Takes the server's events, dropping each entry at once, until the honest
/// sender's connection closes (and with `hostile_ends`, the hostile one
/// too: the server is to end it); then closes the server (ending the
/// hostile one) and drains it.
asio::awaitable<void> application(server& srv, outcome& o, bool hostile_ends) {
  bool closing = false;
  bool honest_closed = false;
  for (;;) {
    auto ev = co_await srv.next();
    o.worst_committed = std::max(o.worst_committed, srv.stats().pool.committed_bytes);
    if (ev.kind == server_event_kind::end_of_stream) break;
    auto s = record(ev);
    if (ev.kind == server_event_kind::blob_complete && tag_sender(s.tag) == honest_who) {
      o.honest_conn = s.conn;
      ++o.honest_blobs_complete;
    }
    if (ev.kind == server_event_kind::connection_closed) {
      o.closed_reasons.push_back(ev.ev.reason);
      if (s.conn == o.honest_conn) {
        honest_closed = true;
      } else if (!o.hostile_error && !closing) {
        o.hostile_error = ev.ev.error;
        o.hostile_reason = ev.ev.reason;
      }
      if (honest_closed && (!hostile_ends || o.hostile_error) && !closing) {
        closing = true;
        srv.close();
      }
    }
    o.events.push_back(std::move(s));
  }
}

/// Runs `attack` (which starts `honest` when it is in place) against a
/// server with `opt`; returns what the application saw.
template <class Attack>
outcome run_case(server_options opt, Attack attack, const char* name, bool hostile_ends = false) {
  BOOST_TEST_MESSAGE("case: " << name);
  runner r;
  honest_process honest;  // joined after the server is gone (it then fails, not hangs)
  auto srv = server::listen(r.ex(), "tcp://127.0.0.1:0", opt).value();
  outcome o;
  r.spawn(application(srv, o, hostile_ends));
  r.spawn(attack(srv.url(), honest));
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)), name << ": hung");
  const std::error_code sent = honest.join();
  BOOST_TEST(!sent, name << ": the honest sender failed: " << sent.message());
  BOOST_TEST(o.honest_blobs_complete == std::size_t(honest_blobs), name);
  BOOST_TEST(all_bytes_ok(o.events), name << ": an entry's bytes or key were not its own");
  const auto st = srv.stats();
  BOOST_TEST(st.pool.committed_high_water <= bound(opt), name);
  BOOST_TEST(o.worst_committed <= bound(opt), name);
  return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_request_for_2_to_the_64_minus_1_gets_one_item_and_the_honest_sender_completes) {
  const auto opt = hostile_case_options();
  run_case(
      opt,
      [&](std::string url, honest_process& honest) -> asio::awaitable<void> {
        hostile h;
        co_await h.start(url);
        BOOST_TEST(!(co_await h.request(~std::uint64_t{0})));
        // Granted: at most one item beyond the budget.
        BOOST_TEST(co_await h.await_credit(max_entry));
        BOOST_TEST(h.granted <= bound(opt));
        honest.start(url);
        co_await h.until_closed();
        BOOST_TEST(h.granted <= bound(opt));
      },
      "2^64-1");
}

BOOST_AUTO_TEST_CASE(entries_held_open_on_a_huge_request_stay_within_the_bound) {
  // The 1 GiB request, its credit then spent on entries sent all
  // but 64 bytes and held open.
  const auto opt = hostile_case_options();
  run_case(
      opt,
      [&](std::string url, honest_process& honest) -> asio::awaitable<void> {
        hostile h;
        co_await h.start(url);
        BOOST_TEST(!(co_await h.request(256 * budget)));
        BOOST_TEST(co_await h.await_credit(max_entry));
        big_entry e(max_entry / 2);
        std::uint64_t used = 0;
        outbox out;
        for (std::uint64_t blob = 1; used + e.credit() <= h.granted; ++blob) {
          frame_blob_begin(out, blob, numbered_tag(9, static_cast<std::uint32_t>(blob)));
          frame_entry_begin(out, blob, 0, e.pe->entry, e.meta);
          frame_data(out, blob, e.pe->entry.off, e.data().first(e.data().size() - 64), h.chunk, true);
          used += e.credit();
        }
        BOOST_TEST(used > 0u);
        BOOST_TEST(!(co_await send_out(*h.t, out)));
        honest.start(url);
        co_await h.until_closed();
      },
      "huge request, entries held open");
}

BOOST_AUTO_TEST_CASE(a_connection_holding_the_whole_budget_idle_is_ended_and_the_honest_one_completes) {
  auto opt = hostile_case_options();
  // Entries as large as the budget may be sent: a request for the whole
  // budget is one item's.
  opt.connection.max_entry_bytes = budget;
  const auto o = run_case(
      opt,
      [&](std::string url, honest_process& honest) -> asio::awaitable<void> {
        hostile h;
        co_await h.start(url);
        // Alone, its share is the whole budget: granted, and never used.
        BOOST_TEST(!(co_await h.request(budget)));
        BOOST_TEST(co_await h.await_credit(budget));
        honest.start(url);
        co_await h.until_closed();
      },
      "hold the budget", true);
  BOOST_TEST((o.hostile_error == errc::timed_out), o.hostile_error.message());
  BOOST_TEST(o.hostile_reason.find("unused credit") != std::string::npos, o.hostile_reason);
}

BOOST_AUTO_TEST_CASE(a_trickling_connection_that_then_asks_for_the_budget_blocks_no_one_and_is_ended) {
  // The stalled connection: asks for half the budget, announces an
  // entry, sends half of it, then one byte at a time, then asks for the
  // whole budget.
  const auto opt = hostile_case_options();
  const auto o = run_case(
      opt,
      [&](std::string url, honest_process& honest) -> asio::awaitable<void> {
        hostile h;
        co_await h.start(url);
        BOOST_TEST(!(co_await h.request(budget / 2)));
        BOOST_TEST(co_await h.await_credit(std::min(budget / 2, max_item(opt))));
        big_entry e(max_entry - 8192);
        const auto d = e.data();
        outbox out;
        frame_blob_begin(out, 1, numbered_tag(9, 1));
        frame_entry_begin(out, 1, 0, e.pe->entry, e.meta);
        std::size_t off = d.size() / 2;
        frame_data(out, 1, e.pe->entry.off, d.first(off), h.chunk, true);
        frame_credit_request(out, budget);
        BOOST_TEST(!(co_await send_out(*h.t, out)));
        honest.start(url);
        // The trickle: one byte every 50 ms (its pacing is the attack).
        asio::steady_timer pause(co_await asio::this_coro::executor);
        while (off < d.size() - 1) {
          pause.expires_after(std::chrono::milliseconds(50));
          co_await pause.async_wait(asio::use_awaitable);
          outbox one;
          frame_data(one, 1, e.pe->entry.off + off, d.subspan(off, 1), h.chunk, true);
          if (co_await send_out(*h.t, one)) break;  // the server ended it
          ++off;
        }
      },
      "trickle, then ask for the budget", true);
  // A byte at a time is no progress: the trickle is ended (stall_timeout).
  BOOST_TEST((o.hostile_error == errc::timed_out), o.hostile_error.message());
  BOOST_TEST(o.hostile_reason.find("no progress") != std::string::npos, o.hostile_reason);
}

BOOST_AUTO_TEST_CASE(a_sender_idle_after_its_entries_completed_owes_nothing) {
  // The stall clock runs for an entry begun and not complete: once every
  // entry is complete an idle sender owes nothing, however long it idles
  // (five stall timeouts here; the wait is the case, not a pacing).
  runner r;
  server_options opt = hostile_case_options();
  opt.connection.stall_timeout = std::chrono::milliseconds(200);
  auto srv = server::listen(r.ex(), "tcp://127.0.0.1:0", opt).value();
  std::vector<seen> got;
  r.spawn(collect_into(srv, 1, got));
  std::error_code sent;
  auto sender_side = [&]() -> asio::awaitable<void> {  // named: it outlives the coroutine
    auto [sec, s] = co_await start_sender(srv.url());
    sent = sec;
    if (sec) co_return;
    // 128 KiB entries: not inline, so each is announced, then its bytes.
    stream_plan p{.who = honest_who, .blobs = 1, .entries = 2, .bytes = 128u << 10, .group = {}};
    if ((sent = co_await stream_blobs(s, p))) co_return;
    asio::steady_timer idle(co_await asio::this_coro::executor, 5 * opt.connection.stall_timeout);
    co_await idle.async_wait(asio::use_awaitable);
    if ((sent = co_await stream_blobs(s, p))) co_return;
    sent = co_await s.shutdown();
  };
  r.spawn(sender_side());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
  BOOST_TEST(!sent, sent.message());
  BOOST_TEST(count(got, server_event_kind::blob_complete) == 2u);
  BOOST_TEST(all_bytes_ok(got));
}

namespace {

/// A sender whose hello offers no features: records whether the server
/// answered it and reads until the connection ends, then closes the server.
asio::awaitable<void> featureless_sender(server& srv, bool& answered, bool& ended) {
  auto ex = co_await asio::this_coro::executor;
  auto [ec, t] = co_await blobpipe::connect(ex, srv.url());
  BOOST_TEST_REQUIRE(!ec, ec.message());
  outbox out;
  frame_hello(out, hello{.role = wire_role::sender, .features = 0});
  BOOST_TEST_REQUIRE(!(co_await send_out(*t, out)));
  frame_reader reader;
  for (;;) {
    auto [rec, f] = co_await reader.next(*t);
    if (rec) break;
    if (f.header.type == frame_type::hello) answered = true;
  }
  ended = true;
  srv.close();
}

asio::awaitable<void> drain_events(server& srv) {
  for (;;) {
    auto ev = co_await srv.next();
    if (ev.kind == server_event_kind::end_of_stream) break;
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_sender_offering_no_credit_grants_is_refused_at_its_hello) {
  // The review's finding: a hello with features 0 got connection.window_bytes
  // of its own (64 MiB), outside the budget; 16 such connections each
  // holding a 60 MiB entry open took a 256 MiB-budget rank to 1 GB.
  runner r;
  auto srv = server::listen(r.ex(), "tcp://127.0.0.1:0", hostile_case_options()).value();
  bool answered = false;
  bool ended = false;
  r.spawn(featureless_sender(srv, answered, ended));
  r.spawn(drain_events(srv));
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)), "hung");
  BOOST_TEST(ended);
  BOOST_TEST(!answered, "the server answered a hello that offers no credit grants");
  BOOST_TEST(srv.stats().handshake_failures == 1u);
  BOOST_TEST(srv.stats().pool.committed_high_water == 0u);
}

namespace {

/// Writes begin+abort pairs of empty blobs, 4,096 to a write (256 KiB),
/// until the server ends the connection; counts the pairs written.
asio::awaitable<void> flood_pairs(hostile& h, std::uint64_t& pairs) {
  outbox out;
  for (;;) {
    out.clear();
    for (int i = 0; i < 4096; ++i) {
      ++pairs;
      frame_blob_begin(out, pairs, numbered_tag(9, static_cast<std::uint32_t>(pairs)));
      frame_blob_abort(out, pairs, "");
    }
    if (co_await send_out(*h.t, out)) co_return;
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_begin_abort_flood_leaves_the_honest_sender_completing_with_its_data) {
  // Without fair turns, a begin+abort flood cuts an honest run from 165
  // to 48 MB/s. The flood's turns on the server's thread are a receive
  // buffer's worth of work, every frame counted as at least 4 KiB
  // (docs/cluster.md "Fair turns"): the honest sender, in its own process,
  // completes with its data while the flood goes on, and the flood's
  // aborts reach the application too (it is slowed, not refused).
  const auto opt = hostile_case_options();
  std::uint64_t pairs = 0;
  const auto o = run_case(
      opt,
      [&](std::string url, honest_process& honest) -> asio::awaitable<void> {
        hostile h;
        co_await h.start(url);
        honest.start(url);
        co_await flood_pairs(h, pairs);
      },
      "begin+abort flood");
  std::size_t flood_aborts = 0;
  for (const auto& s : o.events)
    flood_aborts += s.kind == server_event_kind::blob_aborted && tag_sender(s.tag) == 9;
  BOOST_TEST_MESSAGE("flood: " << pairs << " pairs written, " << flood_aborts << " aborts yielded");
  BOOST_TEST(flood_aborts > 0u);
}

BOOST_AUTO_TEST_CASE(a_request_its_unused_credit_covers_is_met_and_the_stall_clock_ends_it) {
  // The red team's lock: a hello, a blob open, and a request for one byte
  // its first grant covers. Met at once, the request leaves the connection
  // holding credit it could send on, so its stall clock runs.
  const auto opt = hostile_case_options();
  const auto o = run_case(
      opt,
      [&](std::string url, honest_process& honest) -> asio::awaitable<void> {
        hostile h;
        co_await h.start(url);
        BOOST_TEST_REQUIRE(h.granted >= 1u);
        outbox out;
        frame_blob_begin(out, 1, numbered_tag(9, 1));
        frame_credit_request(out, 1);
        BOOST_TEST(!(co_await send_out(*h.t, out)));
        honest.start(url);
        co_await h.until_closed();
      },
      "a covered request", true);
  BOOST_TEST((o.hostile_error == errc::timed_out), o.hostile_error.message());
}

BOOST_AUTO_TEST_CASE(a_request_one_grant_completes_is_met_and_the_stall_clock_ends_it) {
  // One byte more than its first grant: the pool grants that byte, and
  // the request is met once the unused credit covers it, not once grants
  // add up to it.
  const auto opt = hostile_case_options();
  const auto o = run_case(
      opt,
      [&](std::string url, honest_process& honest) -> asio::awaitable<void> {
        hostile h;
        co_await h.start(url);
        const std::uint64_t first = h.granted;
        BOOST_TEST_REQUIRE(first >= 1u);
        outbox out;
        frame_blob_begin(out, 1, numbered_tag(9, 1));
        frame_credit_request(out, first + 1);
        BOOST_TEST(!(co_await send_out(*h.t, out)));
        BOOST_TEST(co_await h.await_credit(first + 1));
        honest.start(url);
        co_await h.until_closed();
      },
      "a request one grant completes", true);
  BOOST_TEST((o.hostile_error == errc::timed_out), o.hostile_error.message());
}

BOOST_AUTO_TEST_CASE(idle_connections_holding_the_budget_unused_give_it_to_a_waiting_sender) {
  // The red team's 256 connections each holding 1 MiB of unused credit, at
  // test scale: four hold the whole budget, no blob open, below the
  // pressed() threshold. The honest sender's request waits for free
  // budget, so the idlest holder is reclaimed and its credit goes to it.
  auto opt = hostile_case_options();
  opt.idle_reclaim_after = std::chrono::milliseconds(200);
  constexpr std::uint64_t holders = 4;
  const auto o = run_case(
      opt,
      [&](std::string url, honest_process& honest) -> asio::awaitable<void> {
        std::vector<hostile> hs(holders);
        for (auto& h : hs) {
          co_await h.start(url);
          BOOST_TEST(!(co_await h.request(budget / holders)));
          BOOST_TEST(co_await h.await_credit(budget / holders));
        }
        honest.start(url);
        for (auto& h : hs) co_await h.until_closed();
      },
      "idle credit holders");
  BOOST_TEST((o.hostile_error == errc::closed), o.hostile_error.message());
  BOOST_TEST(o.hostile_reason.starts_with("reclaimed: idle"), o.hostile_reason);
  BOOST_TEST(o.hostile_reason.find("bytes of unused credit") != std::string::npos, o.hostile_reason);
  BOOST_TEST(o.hostile_reason.find("idle_reclaim_after") != std::string::npos, o.hostile_reason);
}

BOOST_AUTO_TEST_CASE(an_idle_connection_holding_no_credit_is_not_reclaimed_for_credit) {
  // The idlest connection joined when nothing was free (an initial grant
  // of 0): closing it would give the waiting sender nothing, so the
  // holders behind it are reclaimed instead.
  auto opt = hostile_case_options();
  opt.idle_reclaim_after = std::chrono::milliseconds(200);
  opt.connection.max_entry_bytes = budget;  // a request for the budget is one item's
  constexpr std::uint64_t holders = 4;
  const auto o = run_case(
      opt,
      [&](std::string url, honest_process& honest) -> asio::awaitable<void> {
        hostile first;
        co_await first.start(url);
        BOOST_TEST(!(co_await first.request(budget)));
        BOOST_TEST(co_await first.await_credit(budget));
        hostile empty;
        co_await empty.start(url);
        BOOST_TEST(empty.granted == 0u);
        first.t->close();  // its credit goes back to the pool
        std::vector<hostile> hs(holders);
        for (auto& h : hs) {
          co_await h.start(url);
          BOOST_TEST(!(co_await h.request(budget / holders)));
          BOOST_TEST(co_await h.await_credit(budget / holders));
        }
        honest.start(url);
        for (auto& h : hs) co_await h.until_closed();
        co_await empty.until_closed();
      },
      "an idle connection with no credit ahead of the holders");
  bool holder_reclaimed = false;
  for (const auto& why : o.closed_reasons) {
    BOOST_TEST(why.find("holding 0 bytes") == std::string::npos, why);
    holder_reclaimed |= why.find("bytes of unused credit") != std::string::npos;
  }
  BOOST_TEST(holder_reclaimed);
}

namespace {

/// Writes begin+abort pairs whose reasons are `reason_bytes` long, 64 to a
/// write, until the server ends the connection.
asio::awaitable<void> flood_long_aborts(hostile& h, std::size_t reason_bytes) {
  const std::string reason(reason_bytes, 'r');
  outbox out;
  for (std::uint32_t pairs = 0;;) {
    out.clear();
    for (int i = 0; i < 64; ++i) {
      ++pairs;
      frame_blob_begin(out, pairs, numbered_tag(9, pairs));
      frame_blob_abort(out, pairs, reason);
    }
    if (co_await send_out(*h.t, out)) co_return;
  }
}

/// Connection `id`'s events queued for next() now.
std::uint64_t queued_of(const server& srv, std::uint64_t id) {
  for (const auto& c : srv.stats().connections)
    if (c.info->id == id) return c.queued_events;
  return 0;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_flood_of_aborts_queues_at_most_the_bound_while_the_application_is_away) {
  // The red team's 5 GB queue: begin+abort pairs with 4 KiB reasons, and an
  // application that does not call next() for a while. The flood's events
  // stop at max_queued_events_per_connection (its reads stop), and the
  // honest sender beside it gets every entry once the application reads.
  runner r;
  auto opt = hostile_case_options();
  opt.max_queued_events_per_connection = 16;
  auto srv = server::listen(r.ex(), "tcp://127.0.0.1:0", opt).value();
  const std::uint64_t bound_with_opened = opt.max_queued_events_per_connection + 1;
  hostile flooder;  // connection 1
  std::uint64_t most_queued = 0;  // the flood's events queued, at most
  std::vector<seen> got;
  std::error_code sent = make_error_code(errc::aborted);
  std::uint64_t honest_conn = 0;
  auto scenario = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    co_await flooder.start(srv.url());
    r.spawn(flood_long_aborts(flooder, max_reason_bytes));  // until the server ends it
    r.spawn(send_into(srv.url(),
                      {.who = honest_who, .blobs = 8, .entries = 2, .bytes = 4096, .group = {}},
                      sent));
    // Away: until the flood's queue is full (a bound on the wait, not a
    // timing assertion), then a while longer, as a slow application is.
    asio::steady_timer tick(ex);
    for (int i = 0; i < 1000 && queued_of(srv, 1) < bound_with_opened; ++i) {
      tick.expires_after(std::chrono::milliseconds(10));
      co_await tick.async_wait(asio::use_awaitable);
    }
    tick.expires_after(std::chrono::milliseconds(300));
    co_await tick.async_wait(asio::use_awaitable);
    most_queued = queued_of(srv, 1);
    BOOST_TEST(srv.stats().queued_events >= most_queued);
    // Back: every event, until the honest sender's connection closed and
    // the flood, read again, brought four queues' worth of aborts.
    bool honest_closed = false;
    std::uint64_t flood_aborts = 0;
    for (bool closing = false;;) {
      auto ev = co_await srv.next();
      // Once closed, a connection's last events (what its consumer had
      // decoded) come without the bound.
      if (!closing) most_queued = std::max(most_queued, queued_of(srv, 1));
      if (ev.kind == server_event_kind::end_of_stream) break;
      auto s = record(ev);
      if (ev.kind == server_event_kind::blob_complete && tag_sender(s.tag) == honest_who)
        honest_conn = s.conn;
      if (ev.kind == server_event_kind::connection_closed && s.conn == honest_conn &&
          honest_conn != 0)
        honest_closed = true;
      flood_aborts += ev.kind == server_event_kind::blob_aborted && s.conn == 1;
      if (honest_closed && flood_aborts >= 4 * opt.max_queued_events_per_connection && !closing) {
        closing = true;
        srv.close();
      }
      got.push_back(std::move(s));
    }
  };
  r.spawn(scenario());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)), "hung");
  BOOST_TEST(most_queued <= bound_with_opened);
  BOOST_TEST(!sent, "the honest sender: " << sent.message());
  std::size_t honest_blobs_complete = 0;
  for (const auto& s : got)
    honest_blobs_complete +=
        s.kind == server_event_kind::blob_complete && tag_sender(s.tag) == honest_who;
  BOOST_TEST(honest_blobs_complete == 8u);
  BOOST_TEST(all_bytes_ok(got));
}
