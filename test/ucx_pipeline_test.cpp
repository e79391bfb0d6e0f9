// The pipeline (blobpipe/pipeline.hpp) between two processes over UCX, on
// every configuration of ucx_links.hpp: the consumer here, the sender in
// a spawned ucx_pipeline_peer. Blobs with entries large enough for
// rendezvous arrive byte-identical, sent one after another or all at
// once; when the sender process is killed with
// a blob open, that blob is aborted, every completed one stays delivered,
// and the stream ends with peer_failed rather than hanging.
//
// (The single-process pipeline suites run over UCX through
// pipeline_fixture.hpp's links; see docs/ucx.md "Tests".)
#define BOOST_TEST_MODULE ucx_pipeline
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <asio/posix/stream_descriptor.hpp>

#include "blobpipe/transport/ucx.hpp"
#include "test/pipeline_fixture.hpp"
#include "test/ucx_links.hpp"
#include "test/ucx_pipeline_spec.hpp"

extern char** environ;

using namespace blobpipe;
using namespace blobpipe::testing;
namespace bdata = boost::unit_test::data;

namespace {

struct outcome : stream_tally {
  int peer_status = -1;
  bool selected = true;
  std::string why;
};

outcome run_with_peer(const ucx_link& link, const char* mode) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  std::string peer =
      std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "blobpipe") + "/test/ucx_pipeline_peer";
  outcome out;
  runner r;
  auto lis = ucx::listen(r.ex(), 0, "127.0.0.1", link.opt).value();
  std::string port = std::to_string(lis.port()), tls = link.opt.config[0].second, m = mode;
  char* argv[] = {peer.data(), tls.data(), port.data(), m.data(), nullptr};
  pid_t pid = 0;
  BOOST_TEST_REQUIRE(posix_spawn(&pid, peer.c_str(), nullptr, nullptr, argv, environ) == 0);
  // Readable once the peer has exited: the consumer keeps the io_context
  // (and so this side's half of the close handshake) running until then.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  BOOST_TEST_REQUIRE(pidfd >= 0, "pidfd_open failed");
  asio::posix::stream_descriptor exited(r.ex(), pidfd);
  consumer_options copt;
  copt.assemble = assemble_mode::memory;
  copt.max_blob_bytes = 8 << 20;
  copt.window_bytes = 4 << 20;
  consumer c;
  auto consume = [&]() -> asio::awaitable<void> {
    auto [aec, t] = co_await lis.accept();
    BOOST_TEST_REQUIRE(!aec);
    lis.close();
    const transport* raw = t.get();  // the consumer's from here on, alive as long as `c`
    auto [ec, started] = co_await consumer::start(std::move(t), copt);
    BOOST_TEST_REQUIRE(!ec);
    c = std::move(started);
    // Once the hello has come: before UCX has wired the endpoint up (which
    // a just-accepted one may not be yet), it shows only its first lanes.
    out.selected = selected(link, *raw, out.why);
    const auto want = [](std::uint64_t id) {
      return ucx_blob_bytes(ucx_blob(static_cast<int>(id) - 1));
    };
    for (bool end = false; !end;) {
      auto ev = co_await c.next();
      end = out.add(ev, want);
    }
    co_await exited.async_wait(asio::posix::stream_descriptor::wait_read,
                               asio::experimental::as_tuple(asio::use_awaitable));
  };
  r.spawn(consume());
  bool done = r.run(std::chrono::seconds(25));
  if (!done) ::kill(pid, SIGKILL);
  ::waitpid(pid, &out.peer_status, 0);
  BOOST_TEST_REQUIRE(done);
  return out;
}

// Every blob of the peer arrived whole and byte-identical over the link's
// transport, and the peer shut down cleanly.
void expect_all_delivered(const outcome& o) {
  BOOST_TEST(o.selected, o.why);
  BOOST_TEST(o.complete == ucx_blob_count);
  BOOST_TEST(o.mismatched == 0);
  BOOST_TEST(o.aborted == 0);
  BOOST_TEST(!o.last.error, o.last.reason);
  BOOST_TEST((WIFEXITED(o.peer_status) && WEXITSTATUS(o.peer_status) == 0), o.peer_status);
}

}  // namespace

BOOST_DATA_TEST_CASE(blobs_stream_between_processes_intact, bdata::make(ucx_links()), link) {
  BLOBPIPE_SKIP_UNLESS_OFFERED(link);
  expect_all_delivered(run_with_peer(link, "all"));
}

// The same blobs from six producers at once: the consumer takes their
// entries' frames interleaved, with fetches of several entries in flight
// (cross-entry overlap), and every blob still arrives byte-identical.
BOOST_DATA_TEST_CASE(concurrent_blobs_stream_between_processes_intact, bdata::make(ucx_links()),
                     link) {
  BLOBPIPE_SKIP_UNLESS_OFFERED(link);
  expect_all_delivered(run_with_peer(link, "concurrent"));
}

BOOST_DATA_TEST_CASE(killed_sender_aborts_open_blob_and_keeps_completed, bdata::make(ucx_links()),
                     link) {
  BLOBPIPE_SKIP_UNLESS_OFFERED(link);
  auto o = run_with_peer(link, "crash");
  BOOST_TEST(o.selected, o.why);
  BOOST_TEST(o.complete == ucx_blob_count);  // nothing completed is lost
  BOOST_TEST(o.mismatched == 0);
  BOOST_TEST(o.aborted == 1);
  BOOST_TEST((o.last.error == errc::peer_failed), o.last.error.message() << ": " << o.last.reason);
  BOOST_TEST((WIFSIGNALED(o.peer_status) && WTERMSIG(o.peer_status) == SIGKILL), o.peer_status);
}
