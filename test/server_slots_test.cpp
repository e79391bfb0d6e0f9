// blobpipe/cluster/server.hpp max_connections: slots and descriptors taken
// by peers that never finish their handshake go to honest senders. Here the
// process runs out of descriptors first: a forked child serves with
// RLIMIT_NOFILE lowered (its own process, so the limit touches no other
// test), silent sockets from this process fill its table, and an honest
// sender from this process must still get in and complete.
//
// fork() happens before the case creates any Asio object; the child
// passes its port back through a pipe and reports by its exit status.
#define BOOST_TEST_MODULE server_slots_test
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>

#include "blobpipe/protocol/framer.hpp"
#include "test/cluster_fixture.hpp"
#include "test/skip.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

/// Descriptors the child may open beyond those it has once serving.
constexpr int spare_descriptors = 16;
/// Silent sockets: more than the child can accept.
constexpr int silent_count = 3 * spare_descriptors;

/// The highest descriptor this process has open, plus one.
int descriptor_end() {
  int end = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
    end = std::max(end, std::stoi(e.path().filename().string()) + 1);
  return end;
}

/// What the peers that fill the child's table do: send nothing, or a
/// sender's hello and then nothing.
enum class silence { before_hello, after_hello };

/// The child: serves on 127.0.0.1 with no timeout that could free a slot
/// (only running out of descriptors can; with `after_hello`, idle
/// connections may be reclaimed after 50 ms), lowers its descriptor limit,
/// sends its port, and waits for one complete blob with its bytes.
/// 0: the blob came and handshakes (or, after_hello, idle connections)
/// were reclaimed; else which check failed.
int child_main(int port_fd, silence peers) {
  runner r;
  server_options opt;
  if (peers == silence::after_hello) opt.idle_reclaim_after = std::chrono::milliseconds(50);
  opt.handshake_timeout = std::chrono::milliseconds(0);
  opt.connection.handshake_timeout = std::chrono::milliseconds(0);
  opt.connection.stall_timeout = std::chrono::milliseconds(0);
  opt.connection.idle_timeout = std::chrono::milliseconds(0);
  auto srv = server::listen(r.ex(), "tcp://127.0.0.1:0", opt);
  if (!srv) return 10;
  const int end = descriptor_end();
  // Descriptors free below the highest would be room beyond the spare
  // ones: fill them (open returns the lowest free one).
  for (;;) {
    const int fd = ::open("/dev/null", O_RDONLY);
    if (fd < 0) return 17;
    if (fd >= end) {
      ::close(fd);
      break;
    }
  }
  const rlimit lim{static_cast<rlim_t>(end + spare_descriptors),
                   static_cast<rlim_t>(end + spare_descriptors)};
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return 11;
  const std::uint16_t port = srv->port();
  if (::write(port_fd, &port, sizeof port) != sizeof port) return 12;
  ::close(port_fd);
  int rc = 13;  // no blob
  std::uint64_t honest = 0;  // the connection that completed a blob
  std::uint64_t reclaimed_idle = 0;
  auto serve = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await srv->next();
      if (ev.kind == server_event_kind::connection_closed &&
          ev.ev.reason.starts_with("reclaimed: idle"))
        ++reclaimed_idle;
      if (ev.kind == server_event_kind::blob_complete) {
        if (rc == 13) rc = 0;
        honest = ev.connection->id;
      }
      // Its sender shut down in order: done (the silent ones are closed).
      if (ev.kind == server_event_kind::connection_closed && ev.connection->id == honest)
        srv->close();
      if (ev.kind == server_event_kind::entry_ready && !record(ev).bytes_ok) rc = 14;
      if (ev.kind == server_event_kind::end_of_stream) co_return;
    }
  };
  r.spawn(serve());
  if (!r.run()) return 15;
  const auto st = srv->stats();
  std::cerr << "child: " << srv->stats_json() << "\n";
  // Nothing was reclaimed: no test.
  if (rc == 0 && peers == silence::before_hello && st.handshake_failures == 0) rc = 16;
  if (rc == 0 && peers == silence::after_hello && reclaimed_idle == 0) rc = 18;
  return rc;
}

/// A TCP connection to 127.0.0.1:`port` that sends nothing (-1: failed).
int silent_socket(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// A TCP connection to 127.0.0.1:`port` that sends a sender's hello and
/// then nothing (-1: failed).
int hello_then_silent_socket(std::uint16_t port) {
  const int fd = silent_socket(port);
  if (fd < 0) return -1;
  outbox out;
  frame_hello(out, hello{.role = wire_role::sender, .features = feature_credit_grants});
  for (const auto& p : out.pieces()) {
    const auto b = p.bytes(out);
    if (::send(fd, b.data(), b.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(b.size())) {
      ::close(fd);
      return -1;
    }
  }
  return fd;
}

/// Whether the server answered `fd` within `ms` (its hello, or a close).
bool answered(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

}  // namespace

// Was: with `ulimit -n 1024` and 1,100 silent sockets the honest worker got
// in only after 7.2 s (the handshake timeout); with no timeout, never.
BOOST_AUTO_TEST_CASE(out_of_descriptors_the_oldest_handshake_gives_way_to_an_honest_sender) {
#if defined(__SANITIZE_ADDRESS__)
  // UBSan's vptr check reads a vtable only after testing the memory with a
  // pipe; with the descriptor table full on purpose it cannot make one and
  // reports a valid std::error_category as "invalid vptr" (seen in .ci/run).
  print_skip("out_of_descriptors_the_oldest_handshake_gives_way_to_an_honest_sender",
             "the descriptor table is full on purpose, and UBSan needs a pipe for its vptr check");
  return;
#endif
  int fds[2];
  BOOST_TEST_REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  BOOST_TEST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::_exit(child_main(fds[1], silence::before_hello));  // no Boost.Test teardown in the child
  }
  ::close(fds[1]);
  std::uint16_t port = 0;
  const bool got_port = ::read(fds[0], &port, sizeof port) == sizeof port;
  ::close(fds[0]);
  std::vector<int> silent;
  std::error_code sent = make_error_code(errc::closed);
  if (got_port) {
    // The silent ones first: the child accepts what its table allows, and
    // the rest wait in the backlog ahead of the honest sender.
    for (int i = 0; i < silent_count; ++i) {
      const int fd = silent_socket(port);
      BOOST_TEST(fd >= 0, "connect " << i << ": " << std::strerror(errno));
      if (fd >= 0) silent.push_back(fd);
    }
    runner r;
    sender_options sopt;
    sopt.handshake_timeout = std::chrono::seconds(20);  // the bound on this wait
    sent = r.await(send_to("tcp://127.0.0.1:" + std::to_string(port),
                           {.who = 1, .blobs = 1, .entries = 2, .bytes = 4096, .group = {}}, sopt));
    BOOST_TEST(!sent, "the honest sender: " << sent.message());
  }
  if (!got_port || sent) ::kill(pid, SIGKILL);  // it waits for a blob that will not come
  int status = 0;
  BOOST_TEST_REQUIRE(::waitpid(pid, &status, 0) == pid);
  for (int fd : silent) ::close(fd);
  BOOST_TEST_REQUIRE(got_port, "the child sent no port");
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0, "the child's check " << WEXITSTATUS(status) << " failed");
}

// The red team's 1,100 hello-then-silent connections under `ulimit -n
// 1024`: every descriptor holds a finished handshake, so no handshake is
// left to reclaim; the idlest connection gives its descriptor instead.
BOOST_AUTO_TEST_CASE(out_of_descriptors_with_no_handshake_left_the_idlest_connection_gives_way) {
#if defined(__SANITIZE_ADDRESS__)
  print_skip("out_of_descriptors_with_no_handshake_left_the_idlest_connection_gives_way",
             "the descriptor table is full on purpose, and UBSan needs a pipe for its vptr check");
  return;
#endif
  int fds[2];
  BOOST_TEST_REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  BOOST_TEST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::_exit(child_main(fds[1], silence::after_hello));  // no Boost.Test teardown in the child
  }
  ::close(fds[1]);
  std::uint16_t port = 0;
  const bool got_port = ::read(fds[0], &port, sizeof port) == sizeof port;
  ::close(fds[0]);
  std::vector<int> silent;
  std::error_code sent = make_error_code(errc::closed);
  if (got_port) {
    // One at a time, each answered before the next, so every descriptor
    // the child has holds a finished handshake. The first one not answered
    // (2 s: a bound, not a timing assertion) found the table full and
    // waits in the backlog ahead of the honest sender.
    for (int i = 0; i < silent_count; ++i) {
      const int fd = hello_then_silent_socket(port);
      BOOST_TEST(fd >= 0, "connect " << i << ": " << std::strerror(errno));
      if (fd < 0) break;
      silent.push_back(fd);
      if (!answered(fd, 2000)) break;
    }
    runner r;
    sender_options sopt;
    sopt.handshake_timeout = std::chrono::seconds(20);  // the bound on this wait
    sent = r.await(send_to("tcp://127.0.0.1:" + std::to_string(port),
                           {.who = 1, .blobs = 1, .entries = 2, .bytes = 4096, .group = {}}, sopt));
    BOOST_TEST(!sent, "the honest sender: " << sent.message());
  }
  if (!got_port || sent) ::kill(pid, SIGKILL);  // it waits for a blob that will not come
  int status = 0;
  BOOST_TEST_REQUIRE(::waitpid(pid, &status, 0) == pid);
  for (int fd : silent) ::close(fd);
  BOOST_TEST_REQUIRE(got_port, "the child sent no port");
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0, "the child's check " << WEXITSTATUS(status) << " failed");
}

namespace {

/// Wakes the coroutines waiting in wait() (a timer cancelled).
class wakeup {
 public:
  explicit wakeup(asio::any_io_executor ex) : t_(ex, asio::steady_timer::time_point::max()) {}
  asio::awaitable<void> wait() {
    co_await t_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
  void notify_all() { t_.cancel(); }

 private:
  asio::steady_timer t_;
};

/// What the idle-reclaim case's application saw.
struct slots_record {
  std::vector<seen> events;
  std::vector<std::shared_ptr<const received_entry>> held;  // connection 2's entries
  bool hold = true;
  std::uint64_t reclaimed = 0;  // the connection closed with "reclaimed: idle"
  std::string reclaimed_reason;
};

/// The application: records every event, holds connection 2's entries
/// while `rec.hold`, and opens `wake` on each event.
asio::awaitable<void> application(server& srv, slots_record& rec, wakeup& wake) {
  for (;;) {
    auto ev = co_await srv.next();
    rec.events.push_back(record(ev));
    if (ev.kind == server_event_kind::entry_ready && ev.connection->id == 2 && rec.hold)
      rec.held.push_back(ev.ev.entry);
    if (ev.kind == server_event_kind::connection_closed &&
        ev.ev.reason.starts_with("reclaimed: idle")) {
      rec.reclaimed = ev.connection->id;
      rec.reclaimed_reason = ev.ev.reason;
    }
    wake.notify_all();
    if (ev.kind == server_event_kind::end_of_stream) co_return;
  }
}

bool saw(const slots_record& rec, server_event_kind k, std::uint64_t conn) {
  for (const auto& e : rec.events)
    if (e.kind == k && e.conn == conn) return true;
  return false;
}

}  // namespace

// Slots full of finished handshakes: the connection idle longest with no
// blob open and nothing held gives way (connection 3 here, not 4, idle
// for less), not one with an open blob (1, idle longer) nor one whose
// entries the application holds (2); the newcomer (5) completes, and so
// do 1 and 2. Was: 1,030
// connections that said hello and went silent locked a rank out.
BOOST_AUTO_TEST_CASE(with_every_slot_taken_the_idlest_connection_holding_nothing_gives_way) {
  runner r;
  server_options opt;
  opt.max_connections = 4;
  opt.idle_reclaim_after = std::chrono::milliseconds(50);
  auto srv = server::listen(r.ex(), "inproc://server-slots-idle", opt).value();
  slots_record rec;
  wakeup wake(r.ex());
  r.spawn(application(srv, rec, wake));
  auto until = [&](auto pred) -> asio::awaitable<void> {
    while (!pred()) co_await wake.wait();
  };
  std::error_code a_ec, b_ec, d_ec;
  std::string c_reason;  // what the reclaimed sender was told
  auto scenario = [&]() -> asio::awaitable<void> {
    // 1: a blob open, one entry sent.
    auto [e1, a] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!e1, e1.message());
    auto blob = a.open_blob(blob_options{.tag = numbered_tag(0, 0), .group = {}});
    a_ec = co_await blob.emit("e0", value::tensor(fixture_bytes(0, 0, 0, 256)));
    co_await until([&] { return saw(rec, server_event_kind::entry_ready, 1); });
    // 2: a blob complete, its entries held by the application.
    auto [e2, b] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!e2, e2.message());
    b_ec = co_await stream_blobs(b, {.who = 1, .blobs = 1, .entries = 2, .bytes = 256, .group = {}});
    co_await until([&] { return saw(rec, server_event_kind::blob_complete, 2); });
    // 3, then 4: a hello, then nothing (3 idle longer).
    auto [e3, c] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!e3, e3.message());
    co_await until([&] { return saw(rec, server_event_kind::connection_opened, 3); });
    auto [e3b, c2] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!e3b, e3b.message());
    co_await until([&] { return saw(rec, server_event_kind::connection_opened, 4); });
    // Idle past idle_reclaim_after (the rule's precondition, not a timed
    // assertion: idle time only grows on a slow machine).
    asio::steady_timer idle(co_await asio::this_coro::executor, 4 * opt.idle_reclaim_after);
    co_await idle.async_wait(asio::use_awaitable);
    // 5: gets a slot, and streams.
    auto [e4, d] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!e4, "the newcomer: " << e4.message());
    d_ec = co_await stream_blobs(d, {.who = 3, .blobs = 1, .entries = 2, .bytes = 256, .group = {}});
    if (!d_ec) d_ec = co_await d.shutdown();
    co_await until([&] { return rec.reclaimed != 0; });
    // 1 and 2 go on.
    if (!a_ec) a_ec = co_await blob.emit("e1", value::tensor(fixture_bytes(0, 0, 1, 256)));
    if (!a_ec) a_ec = co_await blob.finish();
    if (!a_ec) a_ec = co_await a.shutdown();
    rec.hold = false;
    rec.held.clear();
    if (!b_ec) b_ec = co_await b.shutdown();
    (void)co_await c.shutdown();  // its connection is gone
    c_reason = c.failure_reason();
    (void)co_await c2.shutdown();
    srv.stop_accepting();
  };
  r.spawn(scenario());
  BOOST_TEST_REQUIRE(r.run());
  // The reclaimed sender is told why, in the consumer's close frame.
  BOOST_TEST(c_reason.find("the consumer closed the stream: reclaimed: idle") != std::string::npos,
             c_reason);
  BOOST_TEST(!a_ec, "1 (a blob open): " << a_ec.message());
  BOOST_TEST(!b_ec, "2 (entries held): " << b_ec.message());
  BOOST_TEST(!d_ec, "5 (the newcomer): " << d_ec.message());
  BOOST_TEST(rec.reclaimed == 3u, "reclaimed: connection " << rec.reclaimed);
  BOOST_TEST(rec.reclaimed_reason.find("max_connections") != std::string::npos,
             rec.reclaimed_reason);
  for (std::uint64_t conn : {1u, 2u, 5u})
    BOOST_TEST(saw(rec, server_event_kind::blob_complete, conn), "connection " << conn);
  BOOST_TEST(count(rec.events, server_event_kind::blob_aborted) == 0u);
  BOOST_TEST(all_bytes_ok(rec.events));
  BOOST_TEST(srv.stats().refused == 0u);
}

// More connections with a blob open than any fixed number of tries, all
// idler than the one connection holding nothing: it still gives way, so a
// crowd holding blobs open cannot shield it.
BOOST_AUTO_TEST_CASE(a_crowd_with_blobs_open_does_not_shield_the_idle_connection_behind_it) {
  runner r;
  constexpr int crowd = 24;
  server_options opt;
  opt.max_connections = crowd + 1;
  opt.idle_reclaim_after = std::chrono::milliseconds(50);
  auto srv = server::listen(r.ex(), "inproc://server-slots-crowd", opt).value();
  slots_record rec;
  rec.hold = false;
  wakeup wake(r.ex());
  r.spawn(application(srv, rec, wake));
  auto until = [&](auto pred) -> asio::awaitable<void> {
    while (!pred()) co_await wake.wait();
  };
  std::error_code crowd_ec, newcomer_ec;
  auto scenario = [&]() -> asio::awaitable<void> {
    std::vector<sender> senders;
    std::vector<blob_writer> blobs;
    senders.reserve(crowd);
    blobs.reserve(crowd);
    for (int i = 0; i < crowd; ++i) {  // connections 1..crowd: a blob open
      auto [e, a] = co_await start_sender(srv.url());
      BOOST_TEST_REQUIRE(!e, e.message());
      senders.push_back(std::move(a));
      blobs.push_back(senders.back().open_blob(
          blob_options{.tag = numbered_tag(0, static_cast<std::uint32_t>(i)), .group = {}}));
      if (!crowd_ec)
        crowd_ec = co_await blobs.back().emit(
            "e0", value::tensor(fixture_bytes(0, static_cast<std::uint32_t>(i), 0, 256)));
      const std::uint64_t conn = static_cast<std::uint64_t>(i) + 1;
      co_await until([&] { return saw(rec, server_event_kind::entry_ready, conn); });
    }
    // crowd + 1: a hello, then nothing.
    auto [e2, quiet] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!e2, e2.message());
    co_await until([&] { return saw(rec, server_event_kind::connection_opened, crowd + 1); });
    // Idle past idle_reclaim_after (the rule's precondition, not a timed
    // assertion).
    asio::steady_timer idle(co_await asio::this_coro::executor, 4 * opt.idle_reclaim_after);
    co_await idle.async_wait(asio::use_awaitable);
    auto [e3, d] = co_await start_sender(srv.url());
    BOOST_TEST_REQUIRE(!e3, "the newcomer: " << e3.message());
    newcomer_ec =
        co_await stream_blobs(d, {.who = 3, .blobs = 1, .entries = 2, .bytes = 256, .group = {}});
    if (!newcomer_ec) newcomer_ec = co_await d.shutdown();
    co_await until([&] { return rec.reclaimed != 0; });
    for (auto& b : blobs)
      if (!crowd_ec) crowd_ec = co_await b.finish();
    for (auto& a : senders)
      if (!crowd_ec) crowd_ec = co_await a.shutdown();
    (void)co_await quiet.shutdown();  // its connection is gone
    srv.stop_accepting();
  };
  r.spawn(scenario());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(!crowd_ec, "the crowd: " << crowd_ec.message());
  BOOST_TEST(!newcomer_ec, "the newcomer: " << newcomer_ec.message());
  BOOST_TEST(rec.reclaimed == std::uint64_t{crowd + 1}, "reclaimed: connection " << rec.reclaimed);
  BOOST_TEST(count(rec.events, server_event_kind::blob_complete) == std::size_t{crowd + 1});
  BOOST_TEST(srv.stats().refused == 0u);
}

// Idle for less than idle_reclaim_after: nobody gives way, the newcomer is
// refused (as with idle_reclaim_after 0).
BOOST_AUTO_TEST_CASE(a_connection_idle_for_less_than_idle_reclaim_after_keeps_its_slot) {
  runner r;
  server_options opt;
  opt.max_connections = 1;
  opt.idle_reclaim_after = std::chrono::hours(1);
  auto srv = server::listen(r.ex(), "inproc://server-slots-keep", opt).value();
  auto [e1, a] = r.await(start_sender(srv.url()));
  BOOST_TEST_REQUIRE(!e1, e1.message());
  auto [e2, b] = r.await(start_sender(srv.url()));
  BOOST_TEST((e2 == errc::peer_closed || e2 == errc::peer_failed), e2.message());
  BOOST_TEST(srv.stats().refused == 1u);
  BOOST_TEST(srv.stats().open == 1u);
  srv.close();
}
