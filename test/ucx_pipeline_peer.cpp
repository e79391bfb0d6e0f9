// The sending process of ucx_pipeline_test: connects to 127.0.0.1:PORT
// over UCX with UCX_TLS=TLS and streams ucx_blob(0..ucx_blob_count-1).
//
//   ucx_pipeline_peer TLS PORT all         shutdown() after the last blob
//   ucx_pipeline_peer TLS PORT concurrent  the same blobs, each from its own
//                                          producer at once, then shutdown()
//   ucx_pipeline_peer TLS PORT crash       opens one more blob after them,
//                                          emits an entry and dies by SIGKILL
//                                          with it open
//
// Exit status: 0, or the step that failed (10 + n).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include "blobpipe/pipeline.hpp"
#include "blobpipe/transport/ucx.hpp"
#include "test/ucx_pipeline_spec.hpp"

namespace bp = blobpipe;

namespace {

// Emits blob i's entries into `blob` and finishes it; 0 or the failed step.
asio::awaitable<int> emit_blob(bp::blob_writer blob, int i) {
  const auto spec = bp::testing::ucx_blob(i);
  for (std::size_t e = 0; e < spec.keys.size(); ++e)
    if (co_await blob.emit(spec.keys[e], bp::value::tensor(spec.data[e]))) co_return 12;
  if (co_await blob.finish()) co_return 13;
  co_return 0;
}

// All blobs at once, one producer each (ids in order: opened first).
asio::awaitable<int> emit_concurrently(bp::sender& s) {
  auto ex = co_await asio::this_coro::executor;
  int running = bp::testing::ucx_blob_count, failed = 0;
  for (int i = 0; i < bp::testing::ucx_blob_count; ++i)
    asio::co_spawn(ex, emit_blob(s.open_blob(bp::testing::ucx_blob(i).tag), i),
                   [&](std::exception_ptr e, int rc) {
                     if (e) rc = 20;
                     if (rc != 0 && failed == 0) failed = rc;
                     --running;
                   });
  asio::steady_timer poll(ex);
  while (running > 0) {
    poll.expires_after(std::chrono::milliseconds(1));
    co_await poll.async_wait(asio::use_awaitable);
  }
  co_return failed;
}

// Streams the blobs; returns the exit status.
asio::awaitable<int> stream(bp::ucx::options opt, std::uint16_t port, std::string mode) {
  auto ex = co_await asio::this_coro::executor;
  auto [ec, t] = co_await bp::ucx::connect(ex, "127.0.0.1", port, {}, opt);
  if (ec) co_return 10;
  auto [sec, s] = co_await bp::sender::start(std::move(t));
  if (sec) co_return 11;
  if (mode == "concurrent") {
    if (int rc = co_await emit_concurrently(s)) co_return rc;
  } else {
    for (int i = 0; i < bp::testing::ucx_blob_count; ++i)
      if (int rc = co_await emit_blob(s.open_blob(bp::testing::ucx_blob(i).tag), i)) co_return rc;
  }
  if (mode != "crash") co_return (co_await s.shutdown()) ? 14 : 0;
  const auto partial = bp::testing::ucx_blob(0).data[1];
  auto open = s.open_blob();
  if (co_await open.emit("partial", bp::value::tensor(partial))) co_return 15;
  // Die only once the consumer holds everything but this entry, so the
  // test knows what was complete when the peer failed.
  asio::steady_timer poll(ex);
  while (s.in_flight_bytes() > partial.size() * 4) {
    poll.expires_after(std::chrono::milliseconds(1));
    co_await poll.async_wait(asio::use_awaitable);
  }
  ::raise(SIGKILL);
  co_return 16;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: ucx_pipeline_peer TLS PORT all|concurrent|crash\n");
    return 2;
  }
  const bp::ucx::options opt{{{"TLS", argv[1]}}};
  const auto port = static_cast<std::uint16_t>(std::atoi(argv[2]));
  const std::string mode = argv[3];
  asio::io_context ctx;
  int rc = 1;
  // -Wmismatched-new-delete (GCC 11 and later; seen with 12) is a false
  // positive here, as in examples/rollout/workers.cpp. GCC inlines the
  // coroutines stream() and asio's co_spawn entry point into main. Their
  // frames come from asio's class operator new (awaitable_frame_base, not
  // inlined; it allocates with std::aligned_alloc), and the matching class
  // operator delete is inlined down to std::free (asio::aligned_delete), so
  // GCC sees "operator new" paired with free(). It is asio's own matching
  // allocate/deallocate. Both reports are inlined from this statement, so the
  // suppression covers only it.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
  asio::co_spawn(ctx, stream(opt, port, mode), [&](std::exception_ptr e, int status) {
    rc = status;
    if (!e) return;
    rc = 20;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      std::fprintf(stderr, "ucx_pipeline_peer: %s\n", x.what());
    }
  });
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#pragma GCC diagnostic pop
#endif
  ctx.run();
  return rc;
}
