// The UCX listener against foreign bytes (issue 17, item 5): no byte
// sequence from the network may abort the process. The listening side runs
// in a child process (ucx_listener_peer), so that an abort shows as its
// exit status instead of taking the test down: the test throws foreign
// bytes at the child's port, then makes a real connection, which the child
// answers and then exits 0.
#define BOOST_TEST_MODULE ucx_listener
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

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
    // "port N\n"; EOF first means the child failed to listen.
    FILE* out = ::fdopen(fds[0], "r");
    unsigned p = 0;
    const int got = std::fscanf(out, "port %u", &p);
    std::fclose(out);
    BOOST_TEST_REQUIRE(got == 1, "the child printed no port");
    port_ = static_cast<std::uint16_t>(p);
  }
  ~listening_child() {
    if (pid_ > 0) ::kill(pid_, SIGKILL), ::waitpid(pid_, nullptr, 0);
  }
  std::uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }

  /// The child's exit status (as process.hpp: 128 + signal when killed),
  /// waiting for it up to `guard`; -1 if it is still running then (it is
  /// killed).
  int wait_exit(std::chrono::seconds guard) {
    const auto until = std::chrono::steady_clock::now() + guard;
    int status = 0;
    for (;;) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (std::chrono::steady_clock::now() > until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = 0;
  std::uint16_t port_ = 0;
};

/// Connects a plain TCP socket to 127.0.0.1:port, writes `bytes`, and
/// reads until the far side closes or fails the connection (bounded by
/// `guard`). Returns whether it did.
bool throw_bytes(std::uint16_t port, std::span<const std::byte> bytes,
                 std::chrono::seconds guard) {
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  std::error_code ec;
  s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return true;  // nothing listens any more: the child is gone (see its status)
  asio::write(s, asio::buffer(bytes.data(), bytes.size()), ec);
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

/// A real connection to the child: "ping", expecting "pong".
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
  BOOST_TEST(throw_bytes(child.port(), junk, std::chrono::seconds(10)),
             "the listener neither closed nor failed the foreign connection");
  std::string why;
  BOOST_TEST(ping(child.port(), link.opt, why), why);
  const int status = child.wait_exit(std::chrono::seconds(20));
  BOOST_TEST(status == 0, "the listening process ended with status " << status
                                                                     << " (128 + signal)");
}
