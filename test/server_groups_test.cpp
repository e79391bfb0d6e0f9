// Blob groups at a server (docs/cluster.md "Blob groups"), the rules that
// end a group other than its last member or its timeout (server_test has
// those): members naming different sizes (invalid_argument), more than
// max_open_groups open (too_large), and the server's last connection ending
// with the group open (peer_closed; closed after close()). Each case asserts
// the group's error and the reason's words, and that the group did not
// complete instead.
#define BOOST_TEST_MODULE server_groups_test
#include <boost/test/unit_test.hpp>

#include "lib/cluster/group_tracker.hpp"
#include "test/cluster_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

/// A group event the application saw.
struct group_seen {
  bool complete = false;
  blob_group group;
  std::error_code error;
  std::string reason;
};

/// What the application saw: every event, and the group events with reasons.
struct seen_all {
  std::vector<seen> events;
  std::vector<group_seen> groups;
  std::size_t count(server_event_kind k) const { return testing::count(events, k); }
  const group_seen* find(std::uint64_t id) const {
    for (const auto& g : groups)
      if (g.group.id == id) return &g;
    return nullptr;
  }
};

/// Takes events until end_of_stream; `on_event` may act on each (stop
/// accepting, open a gate, close the server).
asio::awaitable<void> application(server& srv, seen_all& out,
                                  std::function<void(const server_event&)> on_event) {
  for (;;) {
    auto ev = co_await srv.next();
    out.events.push_back(record(ev));
    if (ev.kind == server_event_kind::group_complete ||
        ev.kind == server_event_kind::group_aborted)
      out.groups.push_back({ev.kind == server_event_kind::group_complete, *ev.ev.group,
                            ev.ev.error, ev.ev.reason});
    on_event(ev);
    if (ev.kind == server_event_kind::end_of_stream) co_return;
  }
}

/// Stops accepting once `n` connections have closed.
std::function<void(const server_event&)> stop_after(server& srv, std::size_t n) {
  auto closed = std::make_shared<std::size_t>(0);
  return [&srv, closed, n](const server_event& ev) {
    if (ev.kind == server_event_kind::connection_closed && ++*closed == n) srv.stop_accepting();
  };
}

/// One blob of one entry in group `g`, tagged (who, k).
asio::awaitable<std::error_code> member(sender& s, std::uint32_t who, std::uint32_t k,
                                        blob_group g) {
  auto blob = s.open_blob(blob_options{.tag = numbered_tag(who, k), .group = g});
  const auto x = fixture_bytes(who, k, 0, 16);
  if (auto ec = co_await blob.emit("e0", value::tensor(x))) co_return ec;
  co_return co_await blob.finish();
}

bool has(const std::string& text, const std::string& words) {
  return text.find(words) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(members_naming_different_sizes_abort_their_group) {
  // Group 3: the first member says 2 members, the second 3. Without the
  // rule the second would complete the group (two members of "2").
  runner r;
  auto srv = server::listen(r.ex(), "inproc://groups-sizes").value();
  seen_all got;
  r.spawn(application(srv, got, stop_after(srv, 1)));
  auto one_sender = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    BLOBPIPE_CO_CHECK(member(s, 1, 0, blob_group{3, 2}));
    BLOBPIPE_CO_CHECK(member(s, 1, 1, blob_group{3, 3}));
    BLOBPIPE_CO_CHECK(s.shutdown());
  };
  r.spawn(one_sender());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got.events), "an entry's bytes or key were not its own");
  BOOST_TEST_REQUIRE(got.groups.size() == 1u);
  const group_seen& g = got.groups[0];
  BOOST_TEST(!g.complete);
  BOOST_TEST(g.group.id == 3u);
  BOOST_TEST((g.error == errc::invalid_argument), g.error.message());
  BOOST_TEST(has(g.reason, "group 3: a member says 3 members, another 2"), g.reason);
  BOOST_TEST(srv.stats().groups_aborted == 1u);
  BOOST_TEST(srv.stats().groups_complete == 0u);
}

BOOST_AUTO_TEST_CASE(more_than_max_open_groups_are_refused_and_the_open_ones_kept) {
  // max_open_groups 2: groups 1 and 2 open (one member of two each), group
  // 3 is refused at once (too_large); then the second members of 1 and 2
  // complete both.
  runner r;
  server_options opt;
  opt.max_open_groups = 2;
  auto srv = server::listen(r.ex(), "inproc://groups-max-open", opt).value();
  seen_all got;
  r.spawn(application(srv, got, stop_after(srv, 1)));
  auto one_sender = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    BLOBPIPE_CO_CHECK(member(s, 1, 0, blob_group{1, 2}));
    BLOBPIPE_CO_CHECK(member(s, 1, 1, blob_group{2, 2}));
    BLOBPIPE_CO_CHECK(member(s, 1, 2, blob_group{3, 2}));
    BLOBPIPE_CO_CHECK(member(s, 1, 3, blob_group{1, 2}));
    BLOBPIPE_CO_CHECK(member(s, 1, 4, blob_group{2, 2}));
    BLOBPIPE_CO_CHECK(s.shutdown());
  };
  r.spawn(one_sender());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got.events), "an entry's bytes or key were not its own");
  BOOST_TEST_REQUIRE(got.groups.size() == 3u);
  const group_seen& refused = got.groups[0];
  BOOST_TEST(refused.group.id == 3u);
  BOOST_TEST(!refused.complete);
  BOOST_TEST((refused.error == errc::too_large), refused.error.message());
  BOOST_TEST(has(refused.reason, "group 3: more than 2 groups open"), refused.reason);
  for (std::uint64_t id : {1u, 2u}) {
    const group_seen* g = got.find(id);
    BOOST_TEST_REQUIRE(g != nullptr);
    BOOST_TEST(g->complete, "group " << id << ": " << g->reason);
  }
  const auto st = srv.stats();
  BOOST_TEST(st.groups_complete == 2u);
  BOOST_TEST(st.groups_aborted == 1u);
  BOOST_TEST(st.groups_open == 0u);
}

BOOST_AUTO_TEST_CASE(a_group_open_when_the_last_connection_ends_is_aborted_peer_closed) {
  // Group 6 (two members) from two connections. A sends one member and
  // ends: B is still connected, so the group stays open, and B's member
  // completes it. Group 7: one member of two from B, then B ends, the last
  // connection: the group is aborted with peer_closed.
  runner r;
  auto srv = server::listen(r.ex(), "inproc://groups-last-connection").value();
  seen_all got;
  gate a_closed(r.ex());
  std::size_t closed = 0;
  std::uint64_t tasks_at_end = 1;
  r.spawn(application(srv, got, [&](const server_event& ev) {
    if (ev.kind == server_event_kind::end_of_stream) tasks_at_end = srv.stats().tasks_running;
    if (ev.kind != server_event_kind::connection_closed) return;
    if (++closed == 1) a_closed.open();
    if (closed == 2) srv.stop_accepting();
  }));
  gate b_connected(r.ex());
  auto a = [&]() -> asio::awaitable<void> {
    co_await b_connected.wait();
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    BLOBPIPE_CO_CHECK(member(s, 1, 0, blob_group{6, 2}));
    BLOBPIPE_CO_CHECK(s.shutdown());
  };
  auto b = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    b_connected.open();
    co_await a_closed.wait();
    BLOBPIPE_CO_CHECK(member(s, 2, 0, blob_group{6, 2}));
    BLOBPIPE_CO_CHECK(member(s, 2, 1, blob_group{7, 2}));
    BLOBPIPE_CO_CHECK(s.shutdown());
  };
  r.spawn(a());
  r.spawn(b());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got.events), "an entry's bytes or key were not its own");
  BOOST_TEST_REQUIRE(got.groups.size() == 2u);
  const group_seen* six = got.find(6);
  BOOST_TEST_REQUIRE(six != nullptr);
  BOOST_TEST(six->complete, "group 6 ended with the first connection: " << six->reason);
  const group_seen* seven = got.find(7);
  BOOST_TEST_REQUIRE(seven != nullptr);
  BOOST_TEST(!seven->complete);
  BOOST_TEST((seven->error == errc::peer_closed), seven->error.message());
  BOOST_TEST(has(seven->reason, "group 7: 1 of 2 members complete when the server's last "
                                "connection ended"),
             seven->reason);
  // After both connections closed, and before end_of_stream.
  BOOST_TEST(got.events.back().kind == server_event_kind::end_of_stream);
  BOOST_TEST(!got.events.back().error, got.events.back().error.message());
  BOOST_TEST(got.events[got.events.size() - 2].kind == server_event_kind::group_aborted);
  // The group timer (group 7 was open) had ended by then: end_of_stream
  // waits for the server's tasks.
  BOOST_TEST(tasks_at_end == 0u);
}

BOOST_AUTO_TEST_CASE(a_group_open_at_close_is_aborted_closed) {
  runner r;
  auto srv = server::listen(r.ex(), "inproc://groups-close").value();
  seen_all got;
  gate done(r.ex());
  std::uint64_t tasks_at_close = 0;
  std::uint64_t tasks_at_end = 1;
  r.spawn(application(srv, got, [&](const server_event& ev) {
    if (ev.kind == server_event_kind::blob_complete) {
      tasks_at_close = srv.stats().tasks_running;
      srv.close();
    }
    if (ev.kind == server_event_kind::end_of_stream) {
      tasks_at_end = srv.stats().tasks_running;
      done.open();
    }
  }));
  auto one_sender = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    BLOBPIPE_CO_CHECK(member(s, 1, 0, blob_group{8, 3}));
    co_await done.wait();
    s.close();
  };
  r.spawn(one_sender());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got.events), "an entry's bytes or key were not its own");
  const group_seen* g = got.find(8);
  BOOST_TEST_REQUIRE(g != nullptr);
  BOOST_TEST(!g->complete);
  BOOST_TEST((g->error == errc::closed), g->error.message());
  BOOST_TEST(has(g->reason, "group 8: 1 of 3 members complete when"), g->reason);
  // The accept loop, the connection and the group timer (group 8 open)
  // ran at close; all had ended by end_of_stream.
  BOOST_TEST(tasks_at_close >= 3u);
  BOOST_TEST(tasks_at_end == 0u);
}

// Open-group slots are charged to the connection whose member opened the
// group, and one connection may hold at most max_open_groups_per_connection
// of them. Here 3 slots, 2 per connection: connection A opens groups 1 and
// 2 and is refused group 3 (too_large, naming its connection), so
// connection B still opens group 4 and completes it; A's second members
// then complete 1 and 2. Without the per-connection count A would hold all
// three slots and B's group would be refused. A slot comes back when its
// group ends: A then opens and completes group 5.
BOOST_AUTO_TEST_CASE(one_connection_cannot_take_every_open_group_slot) {
  runner r;
  server_options opt;
  opt.max_open_groups = 3;
  opt.max_open_groups_per_connection = 2;
  auto srv = server::listen(r.ex(), "inproc://groups-per-connection", opt).value();
  seen_all got;
  gate a_opened(r.ex()), b_done(r.ex());
  auto stop = stop_after(srv, 2);
  r.spawn(application(srv, got, [&](const server_event& ev) {
    // A's third member was observed (its group opened or refused).
    if (ev.kind == server_event_kind::blob_complete && ev.ev.tag == numbered_tag(1, 2))
      a_opened.open();
    stop(ev);
  }));
  auto sender_a = [&]() -> asio::awaitable<void> {
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    BLOBPIPE_CO_CHECK(member(s, 1, 0, blob_group{1, 2}));
    BLOBPIPE_CO_CHECK(member(s, 1, 1, blob_group{2, 2}));
    BLOBPIPE_CO_CHECK(member(s, 1, 2, blob_group{3, 2}));
    co_await b_done.wait();
    BLOBPIPE_CO_CHECK(member(s, 1, 3, blob_group{1, 2}));
    BLOBPIPE_CO_CHECK(member(s, 1, 4, blob_group{2, 2}));
    // Groups 1 and 2 ended: their slots are A's again.
    BLOBPIPE_CO_CHECK(member(s, 1, 5, blob_group{5, 2}));
    BLOBPIPE_CO_CHECK(member(s, 1, 6, blob_group{5, 2}));
    BLOBPIPE_CO_CHECK(s.shutdown());
  };
  auto sender_b = [&]() -> asio::awaitable<void> {
    co_await a_opened.wait();
    auto [sec, s] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!sec);
    BLOBPIPE_CO_CHECK(member(s, 2, 0, blob_group{4, 2}));
    BLOBPIPE_CO_CHECK(member(s, 2, 1, blob_group{4, 2}));
    BLOBPIPE_CO_CHECK(s.shutdown());
    b_done.open();
  };
  r.spawn(sender_a());
  r.spawn(sender_b());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got.events), "an entry's bytes or key were not its own");
  const group_seen* refused = got.find(3);
  BOOST_TEST_REQUIRE(refused != nullptr);
  BOOST_TEST(!refused->complete);
  BOOST_TEST((refused->error == errc::too_large), refused->error.message());
  BOOST_TEST(has(refused->reason, "group 3: its connection has 2 groups open"), refused->reason);
  for (std::uint64_t id : {1u, 2u, 4u, 5u}) {
    const group_seen* g = got.find(id);
    BOOST_TEST_REQUIRE(g != nullptr, "group " << id);
    BOOST_TEST(g->complete, "group " << id << ": " << g->reason);
  }
  const auto st = srv.stats();
  BOOST_TEST(st.groups_complete == 4u);
  BOOST_TEST(st.groups_aborted == 1u);
}

// The tracker remembers the ids of the last `remembered` ended groups and
// no more, so its memory stays bounded: a member of a group it forgot
// opens that group again; one of a group it remembers counts as late.
BOOST_AUTO_TEST_CASE(a_group_tracker_forgets_the_oldest_ended_group_beyond_its_memory) {
  detail::group_tracker::limits lim;
  lim.remembered = 2;
  detail::group_tracker t(lim);
  const auto now = detail::group_tracker::clock::now();
  auto member = [](std::uint64_t id) {
    event ev;
    ev.kind = event_kind::blob_complete;
    ev.group = blob_group{id, 1};
    return ev;
  };
  for (std::uint64_t id : {1u, 2u, 3u})
    BOOST_TEST_REQUIRE(t.observe(member(id), now).size() == 1u, "group " << id << " completes");
  BOOST_TEST(t.observe(member(3), now).empty(), "a member of a remembered group is late");
  BOOST_TEST(t.late_members() == 1u);
  const auto again = t.observe(member(1), now);
  BOOST_TEST(again.size() == 1u, "a member of a forgotten group opens it again");
  BOOST_TEST(t.late_members() == 1u);
}
