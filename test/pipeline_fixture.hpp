// test/pipeline_fixture.hpp — shared scaffolding for the transport and
// pipeline tests: run coroutines to completion on one io_context, connect a
// sender and a consumer over loopback or TCP (127.0.0.1, ephemeral port),
// and a gate a test opens to release a held-back step.
#pragma once

#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <ostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "blobpipe/pipeline.hpp"
#include "test/frame_io.hpp"
#include "test/skip.hpp"
#include "test/ucx_links.hpp"

/// Awaits an operation that completes with an error_code and checks it is
/// empty. (co_await cannot sit inside BOOST_TEST's expression.)
#define BLOBPIPE_CO_CHECK(op)                                      \
  do {                                                             \
    std::error_code blobpipe_ec_ = co_await (op);                  \
    BOOST_TEST(!blobpipe_ec_, #op << ": " << blobpipe_ec_.message()); \
  } while (0)

namespace blobpipe {
inline std::ostream& operator<<(std::ostream& os, event_kind k) {
  const char* names[] = {"entry_ready", "blob_complete", "blob_aborted", "end_of_stream"};
  return os << names[static_cast<int>(k)];
}
}  // namespace blobpipe

namespace blobpipe::testing {

/// The links behaviour suites run over: in-process loopback, TCP, and UCX
/// with each configuration of test/ucx_links.hpp (tcp, posix, sysv, cma,
/// sm), in that order.
enum class link_kind { loopback, tcp, ucx_tcp, ucx_posix, ucx_sysv, ucx_cma, ucx_sm };

inline bool is_ucx(link_kind l) { return l >= link_kind::ucx_tcp; }

/// The UCX configuration of a ucx_* link.
inline const ucx_link& ucx_config(link_kind l) {
  return ucx_links().at(static_cast<std::size_t>(l) - static_cast<std::size_t>(link_kind::ucx_tcp));
}

inline std::string link_name(link_kind l) {
  if (l == link_kind::loopback) return "loopback";
  if (l == link_kind::tcp) return "tcp";
  return "ucx/" + ucx_config(l).name;
}

/// `links` less the UCX ones whose transport this machine cannot offer
/// (ucx_links.hpp's offered()); each left out prints its SKIPPED line
/// (test/skip.hpp), once, naming the link for the cases that loop over it.
/// When none is left, the running case is a skipped one (ALL SKIPPED
/// counts it).
inline std::vector<link_kind> offered_links(std::vector<link_kind> links) {
  std::vector<link_kind> out;
  for (link_kind l : links) {
    std::string why;
    if (is_ucx(l) && !offered(ucx_config(l), why))
      print_skip("(every case over " + link_name(l) + ")", why);
    else
      out.push_back(l);
  }
  if (out.empty() && !links.empty()) note_this_case_skipped();
  return out;
}

/// Every link this machine offers: what a transport-independent test body
/// loops over.
inline std::vector<link_kind> all_links() {
  return offered_links({link_kind::loopback, link_kind::tcp, link_kind::ucx_tcp,
                        link_kind::ucx_posix, link_kind::ucx_sysv, link_kind::ucx_cma,
                        link_kind::ucx_sm});
}

/// Runs spawned coroutines until all finish. Returns false if they did not
/// finish within the safety limit (a hang guard, not a timing assertion);
/// rethrows the first exception a coroutine threw.
class runner {
 public:
  asio::io_context ctx;
  asio::any_io_executor ex() { return ctx.get_executor(); }

  template <class Awaitable>
  void spawn(Awaitable a) {
    ++live_;
    asio::co_spawn(ctx, std::move(a), [this](std::exception_ptr e) {
      if (e && !error_) error_ = e;
      // Detached helpers (ack readers) may still wait on sockets: stop here.
      if (--live_ == 0) ctx.stop();
    });
  }
  /// Runs `a` to completion (and whatever else is ready meanwhile).
  template <class T>
  T await(asio::awaitable<T> a) {
    std::optional<T> out;
    std::exception_ptr err;
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e, T v) {
      err = e;
      if (!e) out.emplace(std::move(v));
    });
    if (ctx.stopped()) ctx.restart();  // it stops whenever it runs out of work
    for (int idle = 0; !out && !err;) {
      if (ctx.stopped()) ctx.restart();
      if (ctx.run_one_for(std::chrono::seconds(60)) != 0) idle = 0;
      else if (++idle == 2) throw std::runtime_error("await: hung");
    }
    if (err) std::rethrow_exception(err);
    return std::move(*out);
  }
  bool run(std::chrono::seconds guard = std::chrono::seconds(60)) {
    if (ctx.stopped()) ctx.restart();
    ctx.run_for(guard);
    if (error_) std::rethrow_exception(error_);
    return live_ == 0;
  }

 private:
  int live_ = 0;
  std::exception_ptr error_;
};

/// Two connected raw transports (a: the connecting side, b: the accepting side).
inline asio::awaitable<std::pair<std::unique_ptr<transport>, std::unique_ptr<transport>>>
raw_pair(link_kind l, transport_options opt = {}) {
  auto ex = co_await asio::this_coro::executor;
  if (l == link_kind::loopback) co_return loopback::make_pair(ex, opt);
  if (is_ucx(l)) co_return co_await ucx_pair(ucx_config(l), opt);
  auto lis = tcp::listen(ex, 0).value();
  std::unique_ptr<transport> accepted;
  std::error_code aec;
  bool accepted_done = false;
  asio::steady_timer wake(ex, asio::steady_timer::time_point::max());
  asio::co_spawn(ex, lis.accept(opt), [&](std::exception_ptr, auto r) {
    aec = std::get<0>(r);
    accepted = std::move(std::get<1>(r));
    accepted_done = true;
    wake.cancel();
  });
  auto [cec, connected] = co_await tcp::connect(ex, "127.0.0.1", lis.port(), opt);
  if (!accepted_done) co_await wake.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  if (cec || aec) throw std::runtime_error("tcp pair: " + cec.message() + " / " + aec.message());
  co_return std::pair{std::move(connected), std::move(accepted)};
}

struct endpoints {
  sender s;
  consumer c;
};

/// Wraps a sender's transport in a test decorator (forwarding_transport.hpp).
using transport_wrap = std::function<std::unique_ptr<transport>(std::unique_ptr<transport>)>;

/// A started sender and consumer over `l`; the sender's transport wrapped
/// by `wrap_sender` when given.
inline asio::awaitable<endpoints> connect(link_kind l, consumer_options copt = {},
                                          sender_options sopt = {},
                                          transport_wrap wrap_sender = {}) {
  auto ex = co_await asio::this_coro::executor;
  auto [a, b] = co_await raw_pair(l);
  if (wrap_sender) a = wrap_sender(std::move(a));
  endpoints out;
  std::error_code cec;
  bool cdone = false;
  asio::steady_timer wake(ex, asio::steady_timer::time_point::max());
  asio::co_spawn(ex, consumer::start(std::move(b), std::move(copt)),
                 [&](std::exception_ptr, auto r) {
                   cec = std::get<0>(r);
                   out.c = std::move(std::get<1>(r));
                   cdone = true;
                   wake.cancel();
                 });
  auto [sec, s] = co_await sender::start(std::move(a), sopt);
  if (!cdone) co_await wake.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  if (sec || cec) throw std::runtime_error("connect: " + sec.message() + " / " + cec.message());
  out.s = std::move(s);
  co_return out;
}

/// A started sender connected over TCP to 127.0.0.1:`port`.
inline asio::awaitable<sender> connect_sender_async(std::uint16_t port, sender_options sopt = {}) {
  auto ex = co_await asio::this_coro::executor;
  auto [ec, t] = co_await tcp::connect(ex, "127.0.0.1", port);
  if (ec) throw std::runtime_error("connect: " + ec.message());
  auto [sec, s] = co_await sender::start(std::move(t), sopt);
  if (sec) throw std::runtime_error("sender::start: " + sec.message());
  co_return std::move(s);
}
inline asio::awaitable<sender> connect_sender(runner&, std::uint16_t port) {
  return connect_sender_async(port);
}

/// A one-shot gate: wait() suspends until open().
class gate {
 public:
  explicit gate(asio::any_io_executor ex) : t_(ex, asio::steady_timer::time_point::max()) {}
  asio::awaitable<void> wait() {
    while (!open_) co_await t_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
  void open() {
    open_ = true;
    t_.cancel();
  }
  bool is_open() const { return open_; }

 private:
  asio::steady_timer t_;
  bool open_ = false;
};

/// What a consumer saw of a stream of memory-assembled blobs, each checked
/// byte for byte against what its sender built.
struct stream_tally {
  int complete = 0, aborted = 0, mismatched = 0;
  event last;  ///< the end_of_stream event, once seen

  /// Counts `ev`; blob_id k (from 1) must equal `want(k)`, a byte vector.
  /// True once `ev` ended the stream.
  template <class Want>
  bool add(const event& ev, Want&& want) {
    if (ev.kind == event_kind::blob_complete) {
      ++complete;
      const auto bytes = want(ev.blob_id);
      if (ev.blob->bytes.size() != bytes.size() ||
          std::memcmp(ev.blob->bytes.data(), bytes.data(), bytes.size()) != 0)
        ++mismatched;
    } else if (ev.kind == event_kind::blob_aborted) {
      ++aborted;
    } else if (ev.kind == event_kind::end_of_stream) {
      last = ev;
      return true;
    }
    return false;
  }
};

/// Lets other ready coroutines run `n` times (a "slow" step without sleeping).
inline asio::awaitable<void> yield_n(int n) {
  auto ex = co_await asio::this_coro::executor;
  for (int i = 0; i < n; ++i) co_await asio::post(ex, asio::use_awaitable);
}

/// Deterministic test bytes: value i of stream `seed`.
inline std::vector<float> ramp(std::size_t n, float seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = seed + static_cast<float>(i);
  return v;
}

}  // namespace blobpipe::testing
