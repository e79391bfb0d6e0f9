// A listening process for ucx_listener_test: listens over UCX with
// UCX_TLS=TLS on 127.0.0.1 (an ephemeral port), prints "port N" on stdout,
// and serves every connection it accepts, each in its own coroutine:
//   "echo:..."  answered with the same bytes ("echo:..."), then the next
//               message is awaited;
//   "ping"      answered with "pong"; once that connection has closed the
//               listener closes and the process exits 0.
// A connection that fails or sends anything else is dropped. The test
// throws foreign bytes at the process before its real connections: if
// anything aborts the process, those fail and the exit status says how it
// died.
//
//   ucx_listener_peer TLS
#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/transport/ucx.hpp"

namespace bp = blobpipe;

namespace {

// Serves one connection; true once it answered "ping" and then closed.
asio::awaitable<bool> serve(std::unique_ptr<bp::transport> t) {
  std::array<std::byte, 64> buf;
  for (;;) {
    auto [ec, got] = co_await t->read_some(buf);
    if (ec || got.bulk_bytes != 0) co_return false;
    const std::string msg(reinterpret_cast<const char*>(buf.data()), got.bytes);
    if (msg == "ping") {
      const std::array<asio::const_buffer, 1> pong{asio::buffer("pong", 4)};
      if (co_await t->write(pong)) co_return false;
      (void)co_await t->read_some(buf);  // the peer closes first: its goodbye ends this
      co_return true;
    }
    if (!msg.starts_with("echo:")) co_return false;
    const std::array<asio::const_buffer, 1> back{asio::buffer(buf.data(), got.bytes)};
    if (co_await t->write(back)) co_return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ucx_listener_peer TLS\n");
    return 2;
  }
  asio::io_context ctx;
  bp::ucx::options opt{{{"TLS", argv[1]}}};
  auto l = bp::ucx::listen(ctx.get_executor(), 0, "127.0.0.1", opt);
  if (!l) {
    std::fprintf(stderr, "ucx_listener_peer: %s\n", l.message().c_str());
    return 2;
  }
  std::printf("port %u\n", static_cast<unsigned>(l->port()));
  std::fflush(stdout);
  int rc = 1;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        for (;;) {
          auto [ec, t] = co_await l->accept();
          if (ec) co_return;
          asio::co_spawn(
              ctx,
              [&, t = std::move(t)]() mutable -> asio::awaitable<void> {
                if (co_await serve(std::move(t))) {
                  rc = 0;
                  l->close();
                }
              },
              asio::detached);
        }
      },
      asio::detached);
  ctx.run();
  return rc;
}
