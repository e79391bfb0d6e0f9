// A peer process for ucx_transport_test: connects to 127.0.0.1:PORT over
// UCX with UCX_TLS=TLS, writes two bulk messages (100 bytes eager, 1 MiB
// rendezvous), then waits for bytes that never come, so the test can kill
// it while its connection is open.
//
//   ucx_test_peer TLS PORT
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/transport/ucx.hpp"

namespace bp = blobpipe;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: ucx_test_peer TLS PORT\n");
    return 2;
  }
  asio::io_context ctx;
  bp::ucx::options opt{{{"TLS", argv[1]}}};
  auto port = static_cast<std::uint16_t>(std::atoi(argv[2]));
  int rc = 1;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto [ec, t] = co_await bp::ucx::connect(ctx.get_executor(), "127.0.0.1", port, {}, opt);
        if (ec) co_return;
        std::vector<std::byte> small(100, std::byte{1}), large(1 << 20, std::byte{2});
        const std::array<std::byte, 8> header{};
        const std::array<asio::const_buffer, 1> s1{asio::buffer(small)}, s2{asio::buffer(large)};
        if (co_await t->write_bulk(header, s1)) co_return;
        if (co_await t->write_bulk(header, s2)) co_return;  // the test kills us here
        std::array<std::byte, 64> buf;
        auto [rec, got] = co_await t->read_some(buf);
        rc = rec ? 3 : 0;
      },
      asio::detached);
  ctx.run();
  return rc;
}
