// The UCX listener and its rendezvous (lib/transport/ucx/rendezvous.hpp)
// against foreign bytes and hostile or clumsy peers: no stray byte sequence
// aborts the process, each is refused by closing that connection, and the
// listener goes on.
//
// Where UCX itself could abort, the listening side runs in a child process
// (ucx_listener_peer), so that an abort shows as the child's exit status
// instead of taking the test down: the test throws bytes at the child's
// ports, then makes real connections, which the child answers before it
// exits 0. Where only blobpipe's own checks run (the rendezvous refuses the
// bytes before UCX sees any), the listener is in this process and its
// counters say what it did.
#define BOOST_TEST_MODULE ucx_listener
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <ucp/api/ucp.h>

#include "test/listening_ports.hpp"
#include "test/ucx_frame_fixture.hpp"

extern char** environ;

using namespace blobpipe;
using namespace blobpipe::testing;
namespace bdata = boost::unit_test::data;

namespace {

std::string peer_path() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "blobpipe") +
         "/test/ucx_listener_peer";
}

/// ucx_listener_peer running with UCX_TLS=tls; killed (if still running)
/// when this goes.
class listening_child {
 public:
  explicit listening_child(std::string tls) {
    int fds[2];
    BOOST_TEST_REQUIRE(::pipe(fds) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    std::string path = peer_path();
    char* argv[] = {path.data(), tls.data(), nullptr};
    const int rc = posix_spawn(&pid_, path.c_str(), &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    BOOST_TEST_REQUIRE(rc == 0, "posix_spawn " << path << ": " << std::strerror(rc));
    // "port N\n"; EOF first means the child failed to listen. What the
    // child prints later (UCX logs to stdout) is copied to this test's
    // log: a closed pipe would kill it with SIGPIPE.
    out_ = ::fdopen(fds[0], "r");
    unsigned p = 0;
    const int got = std::fscanf(out_, "port %u", &p);
    drain_ = std::thread([f = out_] {
      char line[512];
      while (std::fgets(line, sizeof line, f)) std::fputs(line, stderr);
    });
    BOOST_TEST_REQUIRE(got == 1, "the child printed no port");
    port_ = static_cast<std::uint16_t>(p);
  }
  ~listening_child() {
    if (pid_ > 0) ::kill(pid_, SIGKILL), ::waitpid(pid_, nullptr, 0);
    drain_.join();  // the child's end is closed now
    std::fclose(out_);
  }
  std::uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }

  /// The child's exit status (as process.hpp: 128 + signal when killed),
  /// waiting for it up to `guard`; -1 if it is still running then.
  int wait_exit(std::chrono::seconds guard) {
    // Woken by the child's exit (a pidfd polled with the guard), not by a timer.
    const int exited = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    BOOST_TEST_REQUIRE(exited >= 0, "pidfd_open: " << std::strerror(errno));
    pollfd p{exited, POLLIN, 0};
    const auto until = std::chrono::steady_clock::now() + guard;
    int n = 0;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      n = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
      if (n >= 0 || errno != EINTR) break;
    }
    ::close(exited);
    if (n <= 0) return -1;
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = 0;
  std::uint16_t port_ = 0;
  FILE* out_ = nullptr;
  std::thread drain_;
};

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

/// Connects a plain TCP socket to host:port, writes `bytes` (then, if
/// `end_writes`, shuts its sending side: the far end reads end of file),
/// and reads until the far side closes or fails the connection (bounded by
/// `guard`). Returns whether it did. Nothing listening counts as closed
/// (the process's status tells whether it died).
bool throw_bytes(const std::string& host, std::uint16_t port, std::span<const std::byte> bytes,
                 bool end_writes = true, std::chrono::seconds guard = std::chrono::seconds(10)) {
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  std::error_code ec;
  s.connect({asio::ip::make_address(host), port}, ec);
  if (ec) return true;
  asio::write(s, asio::buffer(bytes.data(), bytes.size()), ec);
  if (end_writes) s.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  bool ended = false;
  std::array<char, 256> buf;
  std::function<void()> read_on = [&] {
    s.async_read_some(asio::buffer(buf), [&](std::error_code rec, std::size_t) {
      if (rec) ended = true;
      else read_on();
    });
  };
  read_on();
  io.run_for(guard);
  return ended;
}

/// A rendezvous message header (rendezvous.hpp), for forging them.
std::vector<std::byte> rv_header(std::uint16_t version, std::uint8_t type, std::uint8_t flags,
                                 std::uint32_t length) {
  std::vector<std::byte> h = bytes_of(std::string_view("bpucxrv\0", 8));
  for (int i = 0; i < 2; ++i) h.push_back(static_cast<std::byte>(version >> (8 * i)));
  h.push_back(static_cast<std::byte>(type));
  h.push_back(static_cast<std::byte>(flags));
  for (int i = 0; i < 4; ++i) h.push_back(static_cast<std::byte>(length >> (8 * i)));
  return h;
}

/// Over one connection to the child: "echo:<tag>" answered with itself.
asio::awaitable<bool> echo(transport& t, const std::string& tag) {
  const std::string msg = "echo:" + tag;
  const std::array<asio::const_buffer, 1> out{asio::buffer(msg)};
  if (co_await t.write(out)) co_return false;
  std::array<std::byte, 64> buf;
  auto [ec, got] = co_await t.read_some(buf);
  co_return !ec && std::string(reinterpret_cast<const char*>(buf.data()), got.bytes) == msg;
}

/// A real connection to the child: "ping", expecting "pong", which ends
/// the child.
bool ping(std::uint16_t port, const ucx::options& opt, std::string& why) {
  runner r;
  bool ok = false;
  auto body = [&]() -> asio::awaitable<void> {
    auto [ec, t] = co_await ucx::connect(r.ex(), "127.0.0.1", port, {}, opt);
    if (ec) {
      why = "connect: " + ec.message();
      co_return;
    }
    const std::array<asio::const_buffer, 1> msg{asio::buffer("ping", 4)};
    if (auto wec = co_await t->write(msg)) {
      why = "write: " + wec.message();
      co_return;
    }
    std::array<std::byte, 64> buf;
    auto [rec, got] = co_await t->read_some(buf);
    ok = !rec && got.bytes == 4 && std::memcmp(buf.data(), "pong", 4) == 0;
    if (!ok) why = "no pong: " + rec.message();
    t->close();
  };
  r.spawn(body());
  if (!r.run(std::chrono::seconds(25))) why = "the connection hung";
  return ok;
}

/// The links the issue saw abort: tcp alone and sm,tcp.
const std::vector<ucx_link>& aborting_links() {
  static const std::vector<ucx_link> links = {ucx_links()[0], ucx_links()[4]};
  return links;
}

/// Whether a real connection to `lis` gets through (connect and accept).
asio::awaitable<bool> connect_and_accept(runner& r, ucx::listener& lis, ucx::options o) {
  auto [cec, t] = co_await ucx::connect(r.ex(), "127.0.0.1", lis.port(), {}, o);
  if (cec) co_return false;
  auto [aec, u] = co_await lis.accept();
  co_return !aec && t->is_open() && u->is_open();
}

/// Runs `r`'s context until `done()` holds (bounded).
template <class F>
bool run_until(runner& r, F done, std::chrono::seconds guard = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + guard;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    if (r.ctx.stopped()) r.ctx.restart();
    r.ctx.run_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// A UCX worker of this process's own, apart from blobpipe's runtime and
/// never progressed: its address is what a peer puts in its rendezvous
/// hello, so that the listener creates a real endpoint toward it.
class foreign_worker {
 public:
  explicit foreign_worker(const ucx::options& o) {
    ucp_config_t* cfg = nullptr;
    BOOST_TEST_REQUIRE(ucp_config_read(nullptr, nullptr, &cfg) == UCS_OK);
    for (const auto& [name, value] : o.config)
      BOOST_TEST_REQUIRE(ucp_config_modify(cfg, name.c_str(), value.c_str()) == UCS_OK);
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_AM;
    const ucs_status_t st = ucp_init(&p, cfg, &ctx_);
    ucp_config_release(cfg);
    BOOST_TEST_REQUIRE(st == UCS_OK);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    BOOST_TEST_REQUIRE(ucp_worker_create(ctx_, &wp, &worker_) == UCS_OK);
    ucp_address_t* a = nullptr;
    std::size_t n = 0;
    BOOST_TEST_REQUIRE(ucp_worker_get_address(worker_, &a, &n) == UCS_OK);
    const auto* b = reinterpret_cast<const std::byte*>(a);
    address_.assign(b, b + n);
    ucp_worker_release_address(worker_, a);
  }
  ~foreign_worker() {
    if (worker_) ucp_worker_destroy(worker_);
    if (ctx_) ucp_cleanup(ctx_);
  }
  foreign_worker(const foreign_worker&) = delete;
  foreign_worker& operator=(const foreign_worker&) = delete;
  const std::vector<std::byte>& address() const { return address_; }

 private:
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::byte> address_;
};

}  // namespace

// Sixteen bytes whose first eight, read as the length of UCX's connection
// request header, wrap around: UCX 1.13.1's tcp connection manager died on
// them (tcp_sockcm_ep.c:825, assertion 'cep->comm_ctx.offset <=
// cep->comm_ctx.length'). blobpipe's own listener refuses them and goes on.
BOOST_DATA_TEST_CASE(sixteen_foreign_bytes_on_a_ucx_listener_leave_the_process_running,
                     bdata::make(aborting_links()), link) {
  BLOBPIPE_SKIP_UNLESS_OFFERED(link);
  listening_child child(link.opt.config[0].second);
  const std::vector<std::byte> junk(16, std::byte{0xff});
  BOOST_TEST(throw_bytes("127.0.0.1", child.port(), junk),
             "the listener neither closed nor failed the foreign connection");
  std::string why;
  BOOST_TEST(ping(child.port(), link.opt, why), why);
  const int status = child.wait_exit(std::chrono::seconds(20));
  BOOST_TEST(status == 0, "the listening process ended with status " << status
                                                                     << " (128 + signal)");
}

// UCX's tcp transport listens on ports of its own (one per interface,
// ephemeral), reachable by anyone who can reach the host. Stray bytes
// there (without UCX's connection magic) are refused by UCX and the
// process lives. A forged header after that public magic is not: see
// docs/ucx.md "Foreign bytes" (not tested: it aborts the process).
BOOST_DATA_TEST_CASE(stray_bytes_on_the_ports_of_ucx_tcp_transport_leave_the_process_running,
                     bdata::make(aborting_links()), link) {
  BLOBPIPE_SKIP_UNLESS_OFFERED(link);
  listening_child child(link.opt.config[0].second);
  auto ports = listening_ports(child.pid());
  std::erase_if(ports, [&](const auto& p) { return p.second == child.port(); });
  BOOST_TEST_REQUIRE(!ports.empty(), "found no port of UCX's tcp transport in the child");
  const std::vector<std::vector<std::byte>> strays = {
      std::vector<std::byte>(16, std::byte{0xff}),
      std::vector<std::byte>(16, std::byte{0}),
      bytes_of("GET / HTTP/1.0\r\n\r\n"),
  };
  for (const auto& [host, port] : ports)
    for (const auto& s : strays)
      BOOST_TEST(throw_bytes(host, port, s), host << ":" << port << " kept a stray connection");
  std::string why;
  BOOST_TEST(ping(child.port(), link.opt, why), why);
  const int status = child.wait_exit(std::chrono::seconds(20));
  BOOST_TEST(status == 0, "the listening process ended with status " << status);
}

// Each of these is refused by the rendezvous's own checks, before UCX sees
// a byte of it: the listener closes the connection, counts it, and serves
// the next one.
BOOST_AUTO_TEST_CASE(listener_refuses_bytes_that_are_not_a_rendezvous_and_goes_on) {
  runner r;
  auto lis = ucx::listen(r.ex(), 0, "127.0.0.1", ucx_links()[0].opt).value();
  auto with_body = [](std::vector<std::byte> h, std::size_t n, std::byte fill) {
    h.insert(h.end(), n, fill);
    return h;
  };
  // Each case with the refusal it must get (docs/ucx.md "Connecting"): a
  // part of the listener's last_refusal, or "" where the reason is the
  // transport's or UCX's wording.
  struct hostile {
    std::string what;
    std::vector<std::byte> bytes;
    std::string refusal;
  };
  const std::vector<hostile> cases = {
      {"16 x 0xff", std::vector<std::byte>(16, std::byte{0xff}), "bad magic"},
      {"an HTTP request", bytes_of("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "bad magic"},
      {"a version from the future", rv_header(2, 1, 0, 4), "rendezvous version 2 "},
      {"a claim before the hello", rv_header(1, 2, 0, 4), "unexpected rendezvous message type 2"},
      {"an unknown type", rv_header(1, 200, 0, 0), "unexpected rendezvous message type 200"},
      {"a hello with flags", with_body(rv_header(1, 1, 1, 4), 4, std::byte{0x20}),
       "hello with unknown flags 1"},
      {"an empty hello", rv_header(1, 1, 0, 0), "hello of 0 bytes"},
      {"a hello of 4 GiB", rv_header(1, 1, 0, 0xffffffffu), "hello of 4294967295 bytes"},
      {"a hello over 64 KiB", rv_header(1, 1, 0, (64u << 10) + 1), "hello of 65537 bytes"},
      {"a worker address of another format", with_body(rv_header(1, 1, 0, 8), 8, std::byte{0x0f}), ""},
      {"a hello cut short", with_body(rv_header(1, 1, 0, 100), 10, std::byte{0x20}), ""},
  };
  for (const auto& [what, bytes, refusal] : cases) {
    bool closed = false;
    std::thread client([&, port = lis.port()] { closed = throw_bytes("127.0.0.1", port, bytes); });
    // The listener runs here; the raw client in its thread.
    const auto before = lis.counters().refused;
    BOOST_TEST(run_until(r, [&] { return lis.counters().refused > before; }), what);
    client.join();
    BOOST_TEST(closed, what << ": the listener kept the connection");
    BOOST_TEST(lis.last_refusal().find(refusal) != std::string::npos,
               what << ": refused as '" << lis.last_refusal() << "', not for '" << refusal << "'");
  }
  BOOST_TEST(lis.counters().refused == cases.size());
  BOOST_TEST(lis.counters().connections_ready == 0u);
  // A real connection still gets through.
  BOOST_TEST(r.await(connect_and_accept(r, lis, ucx_links()[0].opt)));
}

// A connection that says nothing holds its slot only until the handshake
// timeout; then it is closed and the slot is free again.
BOOST_AUTO_TEST_CASE(silent_connection_is_closed_at_the_handshake_timeout) {
  runner r;
  ucx::options o = ucx_links()[0].opt;
  o.handshake_timeout = std::chrono::milliseconds(200);
  o.max_pending = 1;
  auto lis = ucx::listen(r.ex(), 0, "127.0.0.1", o).value();
  bool closed = false;
  std::thread client([&, port = lis.port()] {
    closed = throw_bytes("127.0.0.1", port, {}, /*end_writes=*/false);
  });
  BOOST_TEST(run_until(r, [&] { return lis.counters().timed_out == 1; }));
  client.join();
  BOOST_TEST(closed);
  // The one slot is free: a real connection gets it.
  BOOST_TEST(r.await(connect_and_accept(r, lis, o)));
}

// A peer that goes as far as claiming an endpoint number, and then never
// verifies it (no am_verify), holds its rendezvous only until the
// handshake timeout: the listener closes the half-made UCX connection
// (the endpoint it created toward the peer's worker), so its wait for the
// verify ends, the attempt counts as timed out, the peer's socket is
// closed, and the one slot is free for a real connection.
BOOST_AUTO_TEST_CASE(a_peer_that_claims_and_never_verifies_is_closed_at_the_handshake_timeout) {
  runner r;
  ucx::options o = ucx_links()[0].opt;
  o.handshake_timeout = std::chrono::milliseconds(300);
  o.max_pending = 1;
  auto lis = ucx::listen(r.ex(), 0, "127.0.0.1", o).value();
  foreign_worker w(o);
  std::atomic<bool> created{false};
  bool closed = false;
  std::thread peer([&, port = lis.port()] {
    asio::io_context io;
    asio::ip::tcp::socket s(io);
    std::error_code ec;
    s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
    if (ec) return;
    auto send = [&](std::uint8_t type, std::span<const std::byte> body) {
      auto m = rv_header(1, type, 0, static_cast<std::uint32_t>(body.size()));
      m.insert(m.end(), body.begin(), body.end());
      asio::write(s, asio::buffer(m.data(), m.size()), ec);
    };
    auto receive = [&]() -> int {  // the message's type, its body skipped; -1: ended
      std::array<std::byte, 16> h;
      asio::read(s, asio::buffer(h), ec);
      if (ec) return -1;
      std::uint32_t n = 0;
      for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(h[12 + i]) << (8 * i);
      std::vector<std::byte> body(n);
      asio::read(s, asio::buffer(body), ec);
      return ec ? -1 : static_cast<int>(h[10]);
    };
    send(1, w.address());                     // hello: our worker's address
    if (receive() != 1) return;               // the listener's hello
    const std::array<std::byte, 4> sn0{};     // claim number 0 (a new peer's next)
    send(2, sn0);
    if (receive() != 3) return;               // created: its endpoint toward us
    created = true;
    closed = receive() == -1;                 // silent now: only the listener ends it
  });
  BOOST_TEST(run_until(r, [&] { return lis.counters().timed_out == 1; }));
  peer.join();
  BOOST_TEST(created.load(), "the listener never created the endpoint the peer claimed");
  BOOST_TEST(closed);
  // The one slot is free: a real connection gets it.
  BOOST_TEST(r.await(connect_and_accept(r, lis, o)));
}

// Connections taken from the OS and not handed over are capped, and
// silent ones give way, so that silent connections cannot fill every
// pending slot of the rendezvous: at max_pending the oldest rendezvous
// still under way is closed for the new connection, which connects; the
// younger silent one keeps its slot.
BOOST_AUTO_TEST_CASE(a_full_listener_closes_its_oldest_unfinished_rendezvous_for_a_new_one) {
  runner r;
  ucx::options o = ucx_links()[0].opt;
  o.handshake_timeout = std::chrono::milliseconds(0);  // only the cap frees a slot here
  o.max_pending = 2;
  auto lis = ucx::listen(r.ex(), 0, "127.0.0.1", o).value();
  asio::io_context io;  // the silent clients, driven from this thread
  std::vector<asio::ip::tcp::socket> silent;
  for (int i = 0; i < 2; ++i) {
    silent.emplace_back(io);
    // Connected before the sender below: the listener takes them first.
    silent.back().connect({asio::ip::make_address("127.0.0.1"), lis.port()});
  }
  BOOST_TEST(r.await(connect_and_accept(r, lis, o)));
  BOOST_TEST(lis.counters().reclaimed == 1u);
  BOOST_TEST(lis.counters().over_cap == 0u);
  // The oldest silent socket was closed (its end is readable), the other
  // kept (nothing to read).
  auto ended_within = [](asio::ip::tcp::socket& sock, int ms) {
    pollfd p{sock.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return false;
    char c;
    return ::recv(sock.native_handle(), &c, 1, MSG_DONTWAIT) <= 0;
  };
  BOOST_TEST(ended_within(silent[0], 20'000));
  BOOST_TEST(!ended_within(silent[1], 0));
}

// Past max_pending with every slot holding a finished rendezvous (waiting
// for accept()), a new connection is closed at once.
BOOST_AUTO_TEST_CASE(connections_past_max_pending_of_finished_ones_are_closed_at_once) {
  runner r;
  ucx::options o = ucx_links()[0].opt;
  o.handshake_timeout = std::chrono::milliseconds(0);
  o.max_pending = 1;
  auto lis = ucx::listen(r.ex(), 0, "127.0.0.1", o).value();
  auto [cec, t] = r.await(ucx::connect(r.ex(), "127.0.0.1", lis.port(), {}, o));
  BOOST_TEST_REQUIRE(!cec);  // its rendezvous finished: it waits for accept()
  bool second_closed = false;
  std::thread second([&, port = lis.port()] {
    second_closed = throw_bytes("127.0.0.1", port, {}, /*end_writes=*/false);
  });
  BOOST_TEST(run_until(r, [&] { return lis.counters().over_cap == 1; }));
  second.join();
  BOOST_TEST(second_closed);
  BOOST_TEST(lis.counters().reclaimed == 0u);
  BOOST_TEST(lis.last_refusal() == "over max_pending (1)", lis.last_refusal());
  auto [aec, u] = r.await(lis.accept());
  BOOST_TEST(!aec);
}

// connect() to something that is not a blobpipe UCX listener: an answer
// that is not a rendezvous is protocol_violation, silence is timed_out.
BOOST_AUTO_TEST_CASE(connect_to_something_else_fails_cleanly) {
  runner r;
  asio::ip::tcp::acceptor acc(r.ctx, {asio::ip::make_address("127.0.0.1"), 0});
  const std::uint16_t port = acc.local_endpoint().port();
  std::vector<asio::ip::tcp::socket> held;
  auto server = [&](bool answer) -> asio::awaitable<void> {
    auto s = co_await acc.async_accept(asio::use_awaitable);
    if (answer) {
      const std::string junk = "HTTP/1.1 400 Bad Request\r\n\r\n";
      co_await asio::async_write(s, asio::buffer(junk), asio::use_awaitable);
    }
    held.push_back(std::move(s));
  };
  ucx::options o = ucx_links()[0].opt;
  o.handshake_timeout = std::chrono::milliseconds(300);
  std::error_code answered, silent;
  auto client = [&]() -> asio::awaitable<void> {
    auto [e1, t1] = co_await ucx::connect(r.ex(), "127.0.0.1", port, {}, o);
    answered = e1;
    auto [e2, t2] = co_await ucx::connect(r.ex(), "127.0.0.1", port, {}, o);
    silent = e2;
  };
  auto servers = [&]() -> asio::awaitable<void> {
    co_await server(true);
    co_await server(false);
  };
  r.spawn(servers());
  r.spawn(client());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(25)));
  BOOST_TEST((answered == errc::protocol_violation), answered.message());
  BOOST_TEST((silent == errc::timed_out), silent.message());
}

// Many connections at once from one process to another: UCX pairs
// endpoints made from worker addresses by a per-peer count, so every one of
// them must end up joined to its own peer (an echo tagged per connection
// comes back on the connection that sent it), however their rendezvous
// interleave.
BOOST_DATA_TEST_CASE(concurrent_connections_each_reach_their_own_peer,
                     bdata::make(aborting_links()), link) {
  BLOBPIPE_SKIP_UNLESS_OFFERED(link);
  listening_child child(link.opt.config[0].second);
  runner r;
  constexpr int n = 16;
  int echoed = 0;
  std::vector<std::unique_ptr<transport>> keep;
  // Named: a lambda coroutine's captures live in the closure, which must
  // outlive the coroutine.
  auto one = [&](int i) -> asio::awaitable<void> {
    auto [ec, t] = co_await ucx::connect(r.ex(), "127.0.0.1", child.port(), {}, link.opt);
    BOOST_TEST_REQUIRE(!ec, ec.message());
    if (co_await echo(*t, std::to_string(i))) ++echoed;
    keep.push_back(std::move(t));
  };
  for (int i = 0; i < n; ++i) r.spawn(one(i));
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
  BOOST_TEST(echoed == n);
  keep.clear();
  std::string why;
  BOOST_TEST(ping(child.port(), link.opt, why), why);
  BOOST_TEST(child.wait_exit(std::chrono::seconds(20)) == 0);
}

// The same within one process (both ends on one worker: the listener makes
// both endpoints).
BOOST_AUTO_TEST_CASE(concurrent_connections_on_one_worker_each_reach_their_own_peer) {
  runner r;
  auto lis = ucx::listen(r.ex(), 0, "127.0.0.1", ucx_links()[0].opt).value();
  constexpr int n = 16;
  int echoed = 0;
  std::vector<std::unique_ptr<transport>> keep;
  auto answer = [&](std::unique_ptr<transport> t) -> asio::awaitable<void> {
    std::array<std::byte, 64> buf;
    auto [rec, got] = co_await t->read_some(buf);
    if (rec) co_return;
    const std::array<asio::const_buffer, 1> back{asio::buffer(buf.data(), got.bytes)};
    (void)co_await t->write(back);
    keep.push_back(std::move(t));
  };
  auto server = [&]() -> asio::awaitable<void> {
    for (int i = 0; i < n; ++i) {
      auto [ec, t] = co_await lis.accept();
      BOOST_TEST_REQUIRE(!ec, ec.message());
      r.spawn(answer(std::move(t)));
    }
  };
  auto one = [&](int i) -> asio::awaitable<void> {
    auto [ec, t] = co_await ucx::connect(r.ex(), "127.0.0.1", lis.port(), {}, ucx_links()[0].opt);
    BOOST_TEST_REQUIRE(!ec, ec.message());
    if (co_await echo(*t, std::to_string(i))) ++echoed;
    keep.push_back(std::move(t));
  };
  r.spawn(server());
  for (int i = 0; i < n; ++i) r.spawn(one(i));
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
  BOOST_TEST(echoed == n);
}

// Rendezvous cut off at every stage (a connect whose handshake timeout
// passes at once, or after a few milliseconds) leave the two workers'
// endpoint counts apart; later connections still pair (the listener skips
// numbers, or has the connecting side claim again).
BOOST_DATA_TEST_CASE(rendezvous_cut_short_leave_later_connections_working,
                     bdata::make(aborting_links()), link) {
  BLOBPIPE_SKIP_UNLESS_OFFERED(link);
  // Each cut-short connect force-closes its half-wired endpoint. Before
  // connection::close_now held the worker on (failed_wireup_linger), the
  // last close also destroyed this process's worker while the listener's
  // UCX was still connecting to it, and UCX 1.13's tcp transport then
  // aborted the listener (tcp_ep.c:478) about one run in ten.
  listening_child child(link.opt.config[0].second);
  runner r;
  int cut = 0;
  auto body = [&]() -> asio::awaitable<void> {
    for (int ms = 1; ms <= 40; ms += 3) {
      ucx::options o = link.opt;
      o.handshake_timeout = std::chrono::milliseconds(ms);
      auto [ec, t] = co_await ucx::connect(r.ex(), "127.0.0.1", child.port(), {}, o);
      if (ec) ++cut;
      if (t) t->close();
    }
    for (int i = 0; i < 4; ++i) {
      auto [ec, t] = co_await ucx::connect(r.ex(), "127.0.0.1", child.port(), {}, link.opt);
      BOOST_TEST(!ec, "connect " << i << " after them: " << ec.message());
      if (ec) co_return;
      BOOST_TEST(co_await echo(*t, "after" + std::to_string(i)));
      t->close();
    }
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(60)));
  const int early = child.wait_exit(std::chrono::seconds(0));
  BOOST_TEST_REQUIRE(early == -1, "the child ended early, status " << early);
  BOOST_TEST_MESSAGE(cut << " of 14 rendezvous were cut short");
  BOOST_TEST(cut > 0);
  std::string why;
  BOOST_TEST(ping(child.port(), link.opt, why), why);
  BOOST_TEST(child.wait_exit(std::chrono::seconds(20)) == 0);
}

// Without tcp at all: the rendezvous needs no UCX connection manager, so
// UCX_TLS=sm alone (shared memory, one host) connects, and the process
// listens on no port but the rendezvous's.
BOOST_AUTO_TEST_CASE(shared_memory_alone_connects_on_one_host) {
  const ucx_link sm_only{"sm-only", {{{"TLS", "sm"}}}, "/memory"};
  BLOBPIPE_SKIP_UNLESS_OFFERED(sm_only);
  listening_child child("sm");
  const auto ports = listening_ports(child.pid());
  BOOST_TEST_REQUIRE(ports.size() == 1u);
  BOOST_TEST(ports[0].second == child.port());
  runner r;
  bool ok = false;
  std::string lanes;
  auto body = [&]() -> asio::awaitable<void> {
    auto [ec, t] = co_await ucx::connect(r.ex(), "127.0.0.1", child.port(), {}, sm_only.opt);
    BOOST_TEST_REQUIRE(!ec, ec.message());
    ok = co_await echo(*t, "sm");
    lanes = ucx::describe(*t).value();
    t->close();
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(25)));
  BOOST_TEST(ok);
  BOOST_TEST(lanes.find("tcp") == std::string::npos, lanes);
  std::string why;
  BOOST_TEST(ping(child.port(), sm_only.opt, why), why);
  BOOST_TEST(child.wait_exit(std::chrono::seconds(20)) == 0);
}
