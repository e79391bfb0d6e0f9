// A listening process for ucx_listener_test: listens over UCX with
// UCX_TLS=TLS on 127.0.0.1 (an ephemeral port), prints "port N" on stdout,
// then accepts connections until one sends the bytes "ping": it answers
// "pong" and exits 0 once that connection has closed. A connection that
// fails or sends anything else is dropped and the next one accepted. The
// test throws foreign bytes at the process before its real connection: if
// anything aborts the process, the real one fails and the exit status says
// how it died.
//
//   ucx_listener_peer TLS
#include <array>
#include <cstdio>
#include <cstring>
#include <string>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/transport/ucx.hpp"

namespace bp = blobpipe;

namespace {

// Whether `t` sent "ping" and got "pong" back.
asio::awaitable<bool> serve(bp::transport& t) {
  std::array<std::byte, 64> buf;
  auto [ec, got] = co_await t.read_some(buf);
  if (ec || got.bytes != 4 || std::memcmp(buf.data(), "ping", 4) != 0) co_return false;
  const std::array<asio::const_buffer, 1> pong{asio::buffer("pong", 4)};
  if (co_await t.write(pong)) co_return false;
  // The peer closes first; its goodbye ends this read.
  (void)co_await t.read_some(buf);
  co_return true;
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
          if (co_await serve(*t)) {
            rc = 0;
            l->close();
            co_return;
          }
        }
      },
      asio::detached);
  ctx.run();
  return rc;
}
