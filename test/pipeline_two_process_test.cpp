// Two processes over TCP on 127.0.0.1 (blobpipe/pipeline.hpp): a forked
// child streams blobs to the parent on an ephemeral port.
//
// fork() happens before either process creates any Asio object; the parent
// listens and passes the port to the child through a pipe.
#define BOOST_TEST_MODULE pipeline_two_process
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>


#include <asio/steady_timer.hpp>

#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

constexpr int blob_count = 8;

/// Blob i, identical in both processes.
struct spec {
  tag_t tag;
  std::vector<std::vector<float>> data;
  std::vector<std::string> keys;
};

spec make_spec(int i) {
  spec s;
  s.tag = make_tag("two-process-" + std::to_string(i)).value();
  for (int e = 0; e < 3; ++e) {
    s.keys.push_back("k" + std::to_string(e));
    s.data.push_back(ramp(static_cast<std::size_t>(100 + 5000 * e + i), float(i)));
  }
  return s;
}

std::vector<std::byte> expected_bytes(const spec& s) {
  std::vector<value> v;
  for (auto& d : s.data) v.push_back(value::tensor(d));
  auto p = plan(s.keys, v, s.tag).value();
  std::vector<std::byte> out(p.nbytes);
  (void)write(p, out).value();
  return out;
}

/// The child: connects, streams the blobs, and with `drop` emits one entry
/// of one more blob and exits without finishing it. Returns the exit code.
int child_main(int port_fd, bool drop) {
  std::uint16_t port = 0;
  if (::read(port_fd, &port, sizeof port) != sizeof port) return 10;
  runner r;
  int rc = 0;
  auto ep = r.await(connect_sender(r, port));
  std::vector<spec> specs;
  for (int i = 0; i < blob_count; ++i) specs.push_back(make_spec(i));
  auto produce = [&]() -> asio::awaitable<void> {
    for (auto& s : specs) {
      auto blob = ep.open_blob(s.tag);
      for (std::size_t e = 0; e < s.keys.size(); ++e)
        if (co_await blob.emit(s.keys[e], value::tensor(s.data[e]))) rc = 11;
      if (co_await blob.finish()) rc = 12;
    }
    if (!drop) {
      if (co_await ep.shutdown()) rc = 13;
      co_return;
    }
    auto open = ep.open_blob();
    if (co_await open.emit("partial", value::tensor(specs[0].data[0]))) rc = 14;
    // Wait until the parent has released everything but this entry, so the
    // exit cannot race the completed blobs (an RST would discard them).
    asio::steady_timer t(co_await asio::this_coro::executor);
    while (ep.in_flight_bytes() > specs[0].data[0].size() * 4) {
      t.expires_after(std::chrono::milliseconds(1));
      co_await t.async_wait(asio::use_awaitable);
    }
  };
  r.spawn(produce());
  if (!r.run()) return 15;
  return rc;  // exiting drops the connection (drop: with a blob open)
}

using parent_result = stream_tally;

parent_result run_pair(bool drop) {
  int fds[2];
  BOOST_TEST_REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  BOOST_TEST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[1]);
    ::_exit(child_main(fds[0], drop));  // no Boost.Test teardown in the child
  }
  ::close(fds[0]);
  parent_result out;
  {
    runner r;
    auto lis = tcp::listen(r.ex(), 0).value();
    const std::uint16_t port = lis.port();
    BOOST_TEST_REQUIRE(::write(fds[1], &port, sizeof port) == sizeof port);
    ::close(fds[1]);
    consumer_options copt;
    copt.assemble = assemble_mode::memory;
    copt.max_blob_bytes = 1 << 20;
    copt.window_bytes = 64 * 1024;
    consumer c;
    auto consume = [&]() -> asio::awaitable<void> {
      auto [aec, t] = co_await lis.accept();
      BOOST_TEST_REQUIRE(!aec);
      auto [ec, started] = co_await consumer::start(std::move(t), copt);
      BOOST_TEST_REQUIRE(!ec);
      c = std::move(started);
      const auto want = [](std::uint64_t id) {
        return expected_bytes(make_spec(static_cast<int>(id) - 1));
      };
      for (bool end = false; !end;) {
        auto ev = co_await c.next();
        end = out.add(ev, want);
      }
    };
    r.spawn(consume());
    BOOST_TEST_REQUIRE(r.run());
  }
  int status = 0;
  BOOST_TEST_REQUIRE(::waitpid(pid, &status, 0) == pid);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(blobs_stream_between_processes_intact) {
  auto r = run_pair(false);
  BOOST_TEST(r.complete == blob_count);
  BOOST_TEST(r.mismatched == 0);
  BOOST_TEST(r.aborted == 0);
  BOOST_TEST(!r.last.error, r.last.reason);
}

BOOST_AUTO_TEST_CASE(producer_process_exit_mid_blob_aborts_only_that_blob) {
  auto r = run_pair(true);
  BOOST_TEST(r.complete == blob_count);  // nothing completed is lost
  BOOST_TEST(r.mismatched == 0);
  BOOST_TEST(r.aborted == 1);
  BOOST_TEST((r.last.error == errc::peer_closed || r.last.error == errc::peer_failed));
}
