// test/ucx_frame_fixture.hpp — scaffolding for the frame-level UCX test
// without the pipeline library: pipeline_fixture.hpp's runner, gate and
// yield_n under their own names (ucx_runner, ucx_gate, ucx_yield), so the
// transport's tests build while the pipeline does not, and both headers
// can be included together.
#pragma once

#include <chrono>
#include <exception>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <utility>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

/// Awaits an operation that completes with an error_code and checks it is
/// empty (co_await cannot sit inside BOOST_TEST's expression).
#ifndef BLOBPIPE_CO_CHECK
#define BLOBPIPE_CO_CHECK(op)                                         \
  do {                                                                \
    std::error_code blobpipe_ec_ = co_await (op);                     \
    BOOST_TEST(!blobpipe_ec_, #op << ": " << blobpipe_ec_.message()); \
  } while (0)
#endif

namespace blobpipe::testing {

/// Runs spawned coroutines until all finish (then stops the io_context).
/// run() returns false if they did not finish within the guard (a hang
/// guard, not a timing assertion); rethrows a coroutine's exception.
class ucx_runner {
 public:
  asio::io_context ctx;
  asio::any_io_executor ex() { return ctx.get_executor(); }

  template <class Awaitable>
  void spawn(Awaitable a) {
    ++live_;
    asio::co_spawn(ctx, std::move(a), [this](std::exception_ptr e) {
      if (e && !error_) error_ = e;
      if (--live_ == 0) ctx.stop();
    });
  }
  /// Runs `a` to completion and returns its value.
  template <class T>
  T await(asio::awaitable<T> a) {
    std::optional<T> out;
    std::exception_ptr err;
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e, T v) {
      err = e;
      if (!e) out.emplace(std::move(v));
    });
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!out && !err && std::chrono::steady_clock::now() < deadline) {
      if (ctx.stopped()) ctx.restart();
      ctx.run_one_for(std::chrono::seconds(1));
    }
    if (err) std::rethrow_exception(err);
    if (!out) throw std::runtime_error("await: hung");
    return std::move(*out);
  }
  bool run(std::chrono::seconds guard = std::chrono::seconds(20)) {
    if (ctx.stopped()) ctx.restart();
    if (live_ > 0) ctx.run_for(guard);
    if (error_) std::rethrow_exception(error_);
    return live_ == 0;
  }

 private:
  int live_ = 0;
  std::exception_ptr error_;
};

/// A one-shot gate: wait() suspends until open().
class ucx_gate {
 public:
  explicit ucx_gate(asio::any_io_executor ex) : t_(ex, asio::steady_timer::time_point::max()) {}
  asio::awaitable<void> wait() {
    while (!open_) co_await t_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
  void open() {
    open_ = true;
    t_.cancel();
  }

 private:
  asio::steady_timer t_;
  bool open_ = false;
};

/// Lets other ready coroutines run `n` times (without sleeping).
inline asio::awaitable<void> ucx_yield(int n) {
  auto ex = co_await asio::this_coro::executor;
  for (int i = 0; i < n; ++i) co_await asio::post(ex, asio::use_awaitable);
}

}  // namespace blobpipe::testing
