// examples/stream_minimal.cpp — the smallest streaming program: a server
// on a free TCP port, one sender that streams a sample, and the entries
// printed as they arrive. Run: bazel/bazelw run //examples:stream_minimal
//
// The lines between "README: begin" and "README: end" are the README's C++
// example, as written there (//python:test_readme checks that they agree).
#include <cstdio>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/cluster/server.hpp"
#include "blobpipe/transport/url.hpp"

int status = 0;  // main's exit status

asio::awaitable<void> produce(blobpipe::server& srv) {
  auto ex = co_await asio::this_coro::executor;
  const std::string url = srv.url();
  std::vector<std::int64_t> ids = {101, 2023, 2003, 1037, 7099, 102};
  const float reward = 0.5f;
  // README: begin
  // A rollout worker: one sample, one blob of two entries. The sender keeps
  // each blob until the trainer acknowledges it, and reconnects and resends.
  auto [ec, s] = co_await blobpipe::sender::start(blobpipe::connector(ex, url).value());
  if (!ec) {
    auto blob = s.open_blob();
    ec = co_await blob.emit("0@input_ids", blobpipe::value::tensor(ids));   // [6] int64
    if (!ec) ec = co_await blob.emit("0@reward", blobpipe::value::scalar(reward));
    if (!ec) ec = co_await blob.finish();
    if (!ec) ec = co_await s.shutdown();
  }
  // README: end
  if (ec) {
    std::fprintf(stderr, "stream_minimal: %s\n", ec.message().c_str());
    status = 1;
    srv.close();  // ends consume()
  }
}

asio::awaitable<void> consume(blobpipe::server& srv) {
  // README: begin
  // A trainer: each entry the moment its bytes are in, before its blob ends.
  for (;;) {
    auto ev = co_await srv.next();
    if (ev.kind == blobpipe::server_event_kind::entry_ready)
      std::printf("%s: %zu bytes from %s\n", ev.ev.entry->entry.key.c_str(),
                  ev.ev.entry->view.bytes.size(), ev.connection->peer.c_str());
    if (ev.kind == blobpipe::server_event_kind::connection_closed) srv.stop_accepting();
    if (ev.kind == blobpipe::server_event_kind::end_of_stream) co_return;
  }
  // README: end
}

int main() {
  asio::io_context ctx;
  auto srv = blobpipe::server::listen(ctx.get_executor(), "tcp://127.0.0.1:0").value();
  asio::co_spawn(ctx, consume(srv), asio::detached);
  asio::co_spawn(ctx, produce(srv), asio::detached);
  ctx.run();
  return status;
}
