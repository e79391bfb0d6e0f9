// blobpipe/cluster/router.hpp: the policies (round-robin, by rank, least
// outstanding), groups kept on one destination and completed there, a
// destination gone for good, and resend sessions delivering exactly once
// per destination across reconnects.
#define BOOST_TEST_MODULE router_test
#include <boost/test/unit_test.hpp>

#include <deque>
#include <set>

#include "blobpipe/cluster/router.hpp"
#include "test/cluster_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

/// K servers on inproc://NAME-0 .. NAME-(K-1).
std::vector<server> servers(runner& r, const std::string& name, int k, server_options opt = {}) {
  std::vector<server> out;
  for (int i = 0; i < k; ++i)
    out.push_back(server::listen(r.ex(), "inproc://" + name + "-" + std::to_string(i), opt).value());
  return out;
}

std::vector<std::string> urls(const std::vector<server>& s) {
  std::vector<std::string> out;
  for (const auto& x : s) out.push_back(x.url());
  return out;
}

/// One blob of one entry (fixture_bytes(who, k, 0, bytes)) through `b`.
asio::awaitable<std::error_code> one_blob(blob_writer b, std::uint32_t who, std::uint32_t k,
                                          std::size_t bytes = 100) {
  const auto x = fixture_bytes(who, k, 0, bytes);
  if (auto ec = co_await b.emit("e0", value::tensor(x))) co_return ec;
  co_return co_await b.finish();
}

std::vector<tag_t> completed_tags(const std::vector<seen>& v) {
  std::vector<tag_t> out;
  for (const auto& s : v)
    if (s.kind == server_event_kind::blob_complete) out.push_back(s.tag);
  return out;
}

/// Yields until `done()` or `n` rounds passed; true when done.
template <class Done>
asio::awaitable<bool> until(Done done, int n = 100000) {
  for (int i = 0; i < n && !done(); ++i) co_await yield_n(1);
  co_return done();
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_robin_spreads_blobs_and_by_rank_sends_each_to_its_rank) {
  for (auto policy : {route_policy::round_robin, route_policy::by_rank}) {
    runner r;
    auto srv = servers(r, policy == route_policy::round_robin ? "router-rr" : "router-rank", 3);
    std::vector<std::vector<seen>> got(3);
    for (int i = 0; i < 3; ++i) r.spawn(collect_into(srv[i], 1, got[i]));
    std::vector<std::size_t> dest;
    auto produce = [&]() -> asio::awaitable<void> {
      auto ex = co_await asio::this_coro::executor;
      auto [ec, rt] = co_await router::start(ex, urls(srv), {.policy = policy});
      BOOST_TEST_REQUIRE(!ec, ec.message());
      for (std::uint32_t k = 0; k < 9; ++k) {
        auto b = rt.open_blob({.tag = numbered_tag(0, k), .group = {}, .rank = 7u * k});
        BOOST_TEST_REQUIRE(b.has_value(), b.message());
        dest.push_back(b->destination);
        BLOBPIPE_CO_CHECK(one_blob(b->blob, 0, k));
      }
      BLOBPIPE_CO_CHECK(rt.shutdown());
      const auto st = rt.stats();
      BOOST_TEST(st.routed == 9u);
      BOOST_TEST(st.total.blobs == 9u);
      BOOST_TEST(st.total.entries == 9u);
    };
    r.spawn(produce());
    BOOST_TEST_REQUIRE(r.run());
    BOOST_TEST(all_bytes_ok(got[2]), "an entry's bytes or key were not its own");
    BOOST_TEST(all_bytes_ok(got[1]), "an entry's bytes or key were not its own");
    BOOST_TEST(all_bytes_ok(got[0]), "an entry's bytes or key were not its own");
    BOOST_TEST_REQUIRE(dest.size() == 9u);
    for (std::uint32_t k = 0; k < 9; ++k) {
      const std::size_t want = policy == route_policy::round_robin ? k % 3 : (7 * k) % 3;
      BOOST_TEST(dest[k] == want);
      const auto tags = completed_tags(got[want]);
      BOOST_TEST(std::count(tags.begin(), tags.end(), numbered_tag(0, k)) == 1);
    }
    for (int i = 0; i < 3; ++i) BOOST_TEST(completed_tags(got[i]).size() == 3u);
  }
}

// A router assigned over closes the one it held, as its destructor does:
// the blob left open on its destination is reported aborted and the
// connection ends.
BOOST_AUTO_TEST_CASE(a_router_assigned_over_closes_the_one_it_held) {
  runner r;
  auto srv = servers(r, "router-assigned-over", 1);
  std::vector<seen> got;
  r.spawn(collect_into(srv[0], 1, got));
  std::error_code emitted, started;
  auto produce = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto [ec, rt] = co_await router::start(ex, urls(srv), {});
    started = ec;
    if (ec) co_return;
    auto b = rt.open_blob({.tag = numbered_tag(0, 1), .group = {}, .rank = {}});
    if (!b) co_return;
    const auto x = fixture_bytes(0, 1, 0, 100);
    emitted = co_await b->blob.emit("e0", value::tensor(x));
    BLOBPIPE_CO_CHECK(rt.at(0).flush());  // the open blob is on the destination
    rt = router{};
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(20)));
  BOOST_TEST(!started, started.message());
  BOOST_TEST(!emitted, emitted.message());
  BOOST_TEST(count(got, server_event_kind::blob_aborted) == 1u);
  BOOST_TEST(count(got, server_event_kind::connection_closed) == 1u);
}

BOOST_AUTO_TEST_CASE(by_rank_without_a_rank_is_refused) {
  runner r;
  auto srv = servers(r, "router-norank", 1);
  auto check = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto [ec, rt] = co_await router::start(ex, urls(srv), {.policy = route_policy::by_rank});
    BOOST_TEST_REQUIRE(!ec);
    auto b = rt.open_blob({});
    BOOST_TEST((b.code() == errc::invalid_argument));
    BOOST_TEST(b.message().find("by_rank needs a rank") != std::string::npos, b.message());
    auto g = rt.open_blob({.group = blob_group{.id = 1, .size = 0}, .rank = 0});
    BOOST_TEST((g.code() == errc::invalid_argument));
    BOOST_TEST(g.message().find("a group of size 0") != std::string::npos, g.message());
    BOOST_TEST(rt.stats().refused == 2u);
    rt.close();
    srv[0].close();
  };
  r.spawn(check());
  BOOST_TEST(r.run());
  auto [ec, none] = r.await(router::start(r.ex(), {}));
  BOOST_TEST((ec == errc::invalid_argument));
  auto [bad, none2] = r.await(router::start(r.ex(), {"tcp://host"}));
  BOOST_TEST((bad == errc::invalid_argument));
}

// router.hpp open_blob and error(): a router that never started (the
// router{} a failed start returns) and one shut down refuse every blob as
// closed, naming which; error() of a destination it does not have is closed.
BOOST_AUTO_TEST_CASE(a_router_not_started_or_shut_down_refuses_blobs_as_closed) {
  runner r;
  auto srv = servers(r, "router-shut", 1);
  auto check = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto [ec, rt] = co_await router::start(ex, urls(srv));
    BOOST_TEST_REQUIRE(!ec);
    BOOST_TEST((rt.error(1) == errc::closed));  // only destination 0
    BLOBPIPE_CO_CHECK(rt.shutdown());
    auto b = rt.open_blob({});
    BOOST_TEST((b.code() == errc::closed), b.message());
    BOOST_TEST(b.message().find("router: shut down") != std::string::npos, b.message());
    BOOST_TEST(rt.stats().refused == 1u);
    srv[0].close();
  };
  r.spawn(check());
  BOOST_TEST(r.run());
  router none;
  auto b = none.open_blob({});
  BOOST_TEST((b.code() == errc::closed), b.message());
  BOOST_TEST(b.message().find("router: not started") != std::string::npos, b.message());
  BOOST_TEST((none.error(0) == errc::closed));
  BOOST_TEST(none.size() == 0u);
}

// docs/cluster.md "Fan-out": round-robin skips a destination that is gone
// (here: unreachable at start), and open_blob fails only when none is left.
BOOST_AUTO_TEST_CASE(round_robin_skips_a_destination_gone_and_refuses_when_none_is_left) {
  runner r;
  auto srv = servers(r, "router-rr-gone", 1);
  std::vector<seen> got0;
  r.spawn(collect_into(srv[0], 1, got0));
  std::vector<std::size_t> dest;
  std::string none_left;
  std::error_code none_left_code;
  auto produce = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    std::vector<std::string> dests = {srv[0].url(), "inproc://router-rr-gone-nobody"};
    auto [ec, rt] = co_await router::start(ex, dests, {.policy = route_policy::round_robin});
    BOOST_TEST_REQUIRE(!ec, ec.message());
    BOOST_TEST(bool(rt.error(1)), "destination 1 was never reached");
    for (std::uint32_t k = 0; k < 4; ++k) {
      auto b = rt.open_blob({.tag = numbered_tag(0, k), .group = {}, .rank = {}});
      BOOST_TEST_REQUIRE(b.has_value(), b.message());
      dest.push_back(b->destination);
      BLOBPIPE_CO_CHECK(one_blob(b->blob, 0, k));
    }
    BLOBPIPE_CO_CHECK(rt.at(0).flush());
    srv[0].close();
    BOOST_TEST(co_await until([&] { return bool(rt.error(0)); }));
    auto none = rt.open_blob({.tag = numbered_tag(0, 9), .group = {}, .rank = {}});
    none_left_code = none.code();
    none_left = none.message();
    BOOST_TEST(rt.stats().refused == 1u);
    rt.close();
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(dest == (std::vector<std::size_t>{0, 0, 0, 0}));
  BOOST_TEST(bool(none_left_code), "open_blob with every destination gone succeeded");
  BOOST_TEST(none_left.find("every destination is gone") != std::string::npos, none_left);
}

namespace {

/// Resend sessions that give up after two attempts 1 ms apart.
router_options resend_twice() {
  router_options opt;
  opt.resend = true;
  opt.sender.resend.max_attempts = 2;
  opt.sender.resend.retry_delay = std::chrono::milliseconds(1);
  return opt;
}

}  // namespace

// A resend destination that never started says why (router::
// failure_reason): its session gave up after max_attempts, and the reason
// names them; a live destination has none.
BOOST_AUTO_TEST_CASE(a_resend_destination_that_never_started_says_why) {
  runner r;
  auto srv = servers(r, "router-why", 1);
  std::vector<seen> got0;
  r.spawn(collect_into(srv[0], 1, got0));
  std::string why0, why1;
  std::error_code error1;
  auto produce = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    const router_options opt = resend_twice();
    std::vector<std::string> dests = {srv[0].url(), "inproc://router-why-nobody"};
    auto [ec, rt] = co_await router::start(ex, dests, opt);
    BOOST_TEST_REQUIRE(!ec, ec.message());
    error1 = rt.error(1);
    why0 = rt.failure_reason(0);
    why1 = rt.failure_reason(1);
    BLOBPIPE_CO_CHECK(rt.shutdown());
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(bool(error1), "destination 1 was never reached");
  BOOST_TEST(why0.empty(), why0);
  BOOST_TEST(why1.find("(max_attempts 2)") != std::string::npos, why1);
  BOOST_TEST(why1.find("no handshake with the consumer") != std::string::npos, why1);
}

// When every destination failed (one rank, not listening), start fails and
// the router it returns still says why for each.
BOOST_AUTO_TEST_CASE(a_router_whose_every_destination_failed_still_says_why) {
  runner r;
  std::error_code started, error0;
  std::size_t size = 0;
  std::string why0;
  auto produce = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    const router_options opt = resend_twice();
    std::vector<std::string> dests = {"inproc://router-all-failed-nobody"};
    auto [ec, rt] = co_await router::start(ex, dests, opt);
    started = ec;
    size = rt.size();
    if (size == 1) {
      error0 = rt.error(0);
      why0 = rt.failure_reason(0);
    }
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(bool(started), "start with no destination reached succeeded");
  BOOST_TEST_REQUIRE(size == 1u);
  BOOST_TEST(bool(error0));
  BOOST_TEST(why0.find("(max_attempts 2)") != std::string::npos, why0);
}

BOOST_AUTO_TEST_CASE(least_outstanding_prefers_the_destination_that_keeps_up) {
  runner r;
  server_options held_keep_credit;
  held_keep_credit.connection.held_bytes = 0;  // entries held stay outstanding
  auto srv = servers(r, "router-least", 2, held_keep_credit);
  // Rank 0's application holds every entry; rank 1's drops them at once.
  std::vector<std::shared_ptr<const received_entry>> held;
  std::vector<seen> got1;
  auto hold = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await srv[0].next();
      if (ev.kind == server_event_kind::entry_ready) held.push_back(ev.ev.entry);
      if (ev.kind == server_event_kind::connection_closed) srv[0].stop_accepting();
      if (ev.kind == server_event_kind::end_of_stream) break;
    }
  };
  r.spawn(hold());
  r.spawn(collect_into(srv[1], 1, got1));
  std::vector<std::size_t> dest;
  auto produce = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto [ec, rt] =
        co_await router::start(ex, urls(srv), {.policy = route_policy::least_outstanding});
    BOOST_TEST_REQUIRE(!ec);
    for (std::uint32_t k = 0; k < 10; ++k) {
      // Rank 1 has given back everything sent to it.
      BOOST_TEST(co_await until([&] { return rt.at(1).in_flight_bytes() == 0; }));
      auto b = rt.open_blob({.tag = numbered_tag(0, k), .group = {}, .rank = {}});
      BOOST_TEST_REQUIRE(b.has_value());
      dest.push_back(b->destination);
      BLOBPIPE_CO_CHECK(one_blob(b->blob, 0, k, 8000));
      BLOBPIPE_CO_CHECK(rt.at(b->destination).flush());
    }
    held.clear();
    BLOBPIPE_CO_CHECK(rt.shutdown());
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got1), "an entry's bytes or key were not its own");
  BOOST_TEST_REQUIRE(dest.size() == 10u);
  BOOST_TEST(dest[0] == 0u);  // a tie: the first
  for (std::size_t k = 1; k < dest.size(); ++k) BOOST_TEST(dest[k] == 1u, "blob " << k);
  BOOST_TEST(completed_tags(got1).size() == 9u);
}

BOOST_AUTO_TEST_CASE(a_group_goes_to_one_destination_and_completes_there) {
  runner r;
  // Four groups over three destinations: round-robin alone would split
  // every group (its members' turns fall on different destinations), so
  // only the router's memory of each group keeps it whole.
  auto srv = servers(r, "router-groups", 3);
  std::vector<std::vector<seen>> got(3);
  for (int i = 0; i < 3; ++i) r.spawn(collect_into(srv[i], 1, got[i]));
  std::map<std::uint64_t, std::set<std::size_t>> where;  // group -> destinations
  auto produce = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto [ec, rt] = co_await router::start(ex, urls(srv));
    BOOST_TEST_REQUIRE(!ec);
    // Members interleaved: g0m0 g1m0 g2m0 g3m0 g0m1 ...
    for (std::uint32_t m = 0; m < 3; ++m) {
      for (std::uint64_t g = 0; g < 4; ++g) {
        const auto k = static_cast<std::uint32_t>(g * 10 + m);
        auto b = rt.open_blob({.tag = numbered_tag(0, k), .group = blob_group{100 + g, 3}, .rank = {}});
        BOOST_TEST_REQUIRE(b.has_value());
        where[g].insert(b->destination);
        BLOBPIPE_CO_CHECK(one_blob(b->blob, 0, k));
      }
    }
    BLOBPIPE_CO_CHECK(rt.shutdown());
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run());
  for (int i = 0; i < 3; ++i) BOOST_TEST(all_bytes_ok(got[i]), "an entry's bytes or key were not its own");
  for (const auto& [g, d] : where) BOOST_TEST(d.size() == 1u, "group " << g << " was split");
  std::set<std::uint64_t> complete;
  std::map<std::size_t, std::size_t> groups_at;  // destination -> groups routed there
  for (const auto& [g, d] : where) ++groups_at[*d.begin()];
  for (int i = 0; i < 3; ++i) {
    std::map<std::uint64_t, int> members_done;
    for (const auto& s : got[i]) {
      if (s.kind == server_event_kind::blob_complete) {
        BOOST_TEST_REQUIRE(s.group.has_value());
        ++members_done[s.group->id];
      }
      if (s.kind == server_event_kind::group_complete) {
        BOOST_TEST(members_done[s.group->id] == 3, "complete before its last member");
        BOOST_TEST(s.conn == 0u);
        complete.insert(s.group->id);
      }
    }
    BOOST_TEST(count(got[i], server_event_kind::group_complete) == groups_at[std::size_t(i)]);
    BOOST_TEST(count(got[i], server_event_kind::group_aborted) == 0u);
  }
  BOOST_TEST(complete.size() == 4u);
}

BOOST_AUTO_TEST_CASE(a_destination_gone_for_good_fails_its_blobs_and_the_others_go_on) {
  runner r;
  auto srv = servers(r, "router-gone", 2);
  std::vector<seen> got0;
  r.spawn(collect_into(srv[0], 1, got0));
  auto drop_all = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await srv[1].next();
      if (ev.kind == server_event_kind::end_of_stream) break;
    }
  };
  r.spawn(drop_all());
  std::error_code refused, open_blob_error;
  int to_rank0 = 0;
  auto produce = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    router_options opt{.policy = route_policy::by_rank};
    opt.resend = true;
    opt.sender.resend.max_attempts = 2;
    opt.sender.resend.retry_delay = std::chrono::milliseconds(1);
    auto [ec, rt] = co_await router::start(ex, urls(srv), opt);
    BOOST_TEST_REQUIRE(!ec);
    for (std::uint32_t k = 0; k < 4; ++k) {
      auto b = rt.open_blob({.tag = numbered_tag(0, k), .group = {}, .rank = k});
      BLOBPIPE_CO_CHECK(one_blob(b->blob, 0, k));
    }
    auto open_on_1 = rt.open_blob({.tag = numbered_tag(0, 100), .group = {}, .rank = 1});
    const auto x = fixture_bytes(0, 100, 0, 100);
    const auto x1 = fixture_bytes(0, 100, 1, 100);
    BLOBPIPE_CO_CHECK(open_on_1->blob.emit("e0", value::tensor(x)));
    srv[1].close();  // rank 1 is gone: its listener too, so no reconnect works
    BOOST_TEST(co_await until([&] { return bool(rt.error(1)); }));
    open_blob_error = co_await open_on_1->blob.emit("e1", value::tensor(x1));
    auto again = rt.open_blob({.tag = numbered_tag(0, 101), .group = {}, .rank = 1});
    refused = again.code();
    for (std::uint32_t k = 4; k < 10; k += 2) {  // rank 0 goes on
      auto b = rt.open_blob({.tag = numbered_tag(0, k), .group = {}, .rank = 0});
      BOOST_TEST_REQUIRE(b.has_value());
      BLOBPIPE_CO_CHECK(one_blob(b->blob, 0, k));
      ++to_rank0;
    }
    BLOBPIPE_CO_CHECK(rt.shutdown());  // rank 0's; rank 1's error is rt.error(1)
    BOOST_TEST((rt.error(1) == errc::peer_failed), rt.error(1).message());
    BOOST_TEST(!rt.error(0));
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got0), "an entry's bytes or key were not its own");
  BOOST_TEST((refused == errc::peer_failed), refused.message());
  BOOST_TEST((open_blob_error == errc::peer_failed), open_blob_error.message());
  BOOST_TEST(to_rank0 == 3);
  BOOST_TEST(completed_tags(got0).size() == 2u + 3u);
}

BOOST_AUTO_TEST_CASE(resend_destinations_deliver_exactly_once_across_reconnects) {
  runner r;
  auto srv = servers(r, "router-resend", 2);
  std::vector<std::vector<seen>> got(2);
  std::uint64_t current = 0;  // rank 0's newest connection
  auto watch = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await srv[0].next();
      got[0].push_back(record(ev));
      if (ev.kind == server_event_kind::connection_opened) current = ev.connection->id;
      if (ev.kind == server_event_kind::end_of_stream) break;
    }
  };
  r.spawn(watch());
  r.spawn(collect_into(srv[1], 1, got[1]));
  int cuts = 0;
  auto produce = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    router_options opt;
    opt.resend = true;
    auto [ec, rt] = co_await router::start(ex, urls(srv), opt);
    BOOST_TEST_REQUIRE(!ec);
    for (std::uint32_t k = 0; k < 40; ++k) {
      auto b = rt.open_blob({.tag = numbered_tag(0, k), .group = {}, .rank = {}});
      BOOST_TEST_REQUIRE(b.has_value());
      for (int e = 0; e < 3; ++e) {
        const auto x = fixture_bytes(0, k, static_cast<std::size_t>(e), 500);
        BLOBPIPE_CO_CHECK(b->blob.emit("e" + std::to_string(e), value::tensor(x)));
      }
      if (k == 10 || k == 25) {
        // Rank 0's server cuts its connection with this blob open (the
        // first cut on the first connection, the second on the one the
        // session made after it); the session reconnects and resends.
        BOOST_TEST_REQUIRE(co_await until([&] { return current == std::uint64_t(cuts) + 1; }));
        srv[0].disconnect(current);
        ++cuts;
      }
      BLOBPIPE_CO_CHECK(b->blob.finish());
    }
    BLOBPIPE_CO_CHECK(rt.shutdown());
    BOOST_TEST(rt.stats().destinations[0].metrics.reconnects == 2u);
    srv[0].stop_accepting();
  };
  r.spawn(produce());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got[1]), "an entry's bytes or key were not its own");
  BOOST_TEST(all_bytes_ok(got[0]), "an entry's bytes or key were not its own");
  BOOST_TEST(cuts == 2);
  std::map<tag_t, int> complete;
  for (const auto& v : got) {
    for (const auto& s : v) {
      if (s.kind == server_event_kind::blob_complete) ++complete[s.tag];
      if (s.kind == server_event_kind::blob_aborted) BOOST_TEST(s.resend, "a final abort");
    }
  }
  BOOST_TEST(complete.size() == 40u);
  for (const auto& [tag, n] : complete) BOOST_TEST(n == 1, "a blob delivered " << n << " times");
  BOOST_TEST(srv[0].stats().total.reconnects == 2u);
}

// router_options::group_scope: two jobs sharing a server both number their
// groups from 7; scoped, they are two groups that complete apart, under the
// ids scoped_group_id gives (unscoped, the four members made one group of 2
// and two late members).
BOOST_AUTO_TEST_CASE(group_scope_keeps_two_jobs_alike_ids_apart) {
  runner r;
  auto srv = servers(r, "router-scope", 1);
  std::vector<seen> got;
  r.spawn(collect_into(srv[0], 2, got));
  auto job = [&](std::string scope, std::uint32_t who) -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    router_options opt;
    opt.group_scope = group_scope_of(scope);
    auto [ec, rt] = co_await router::start(ex, urls(srv), opt);
    BOOST_TEST_REQUIRE(!ec);
    for (std::uint32_t k = 0; k < 2; ++k) {
      auto b = rt.open_blob({.tag = numbered_tag(who, k), .group = blob_group{7, 2}, .rank = {}});
      BOOST_TEST_REQUIRE(b.has_value());
      BLOBPIPE_CO_CHECK(one_blob(b->blob, who, k));
    }
    BLOBPIPE_CO_CHECK(rt.shutdown());
  };
  r.spawn(job("job-a", 1));
  r.spawn(job("job-b", 2));
  BOOST_TEST_REQUIRE(r.run());
  std::set<std::uint64_t> complete;
  for (const auto& s : got)
    if (s.kind == server_event_kind::group_complete) complete.insert(s.group->id);
  const std::set<std::uint64_t> want{scoped_group_id(group_scope_of("job-a"), 7), scoped_group_id(group_scope_of("job-b"), 7)};
  BOOST_TEST((complete == want));
  BOOST_TEST(count(got, server_event_kind::group_aborted) == 0u);
  BOOST_TEST(srv[0].stats().late_members == 0u);
  BOOST_TEST(all_bytes_ok(got));
}

BOOST_AUTO_TEST_CASE(scoped_group_ids_stay_distinct_within_a_scope_and_differ_across_scopes) {
  std::set<std::uint64_t> a;
  for (std::uint64_t id = 0; id < 10000; ++id) a.insert(scoped_group_id(group_scope_of("step-1"), id));
  BOOST_TEST(a.size() == 10000u);
  std::size_t shared = 0;
  for (std::uint64_t id = 0; id < 10000; ++id) shared += a.count(scoped_group_id(group_scope_of("step-2"), id));
  BOOST_TEST(shared == 0u);
  BOOST_TEST(scoped_group_id(group_scope_of("step-1"), 5) == scoped_group_id(group_scope_of("step-1"), 5));  // pure
  BOOST_TEST(scoped_group_id(group_scope_of(""), 5) != 5u);  // the function itself always mixes
  BOOST_TEST(group_scope_of("") != 0u);  // 0 would mean no scope
}
