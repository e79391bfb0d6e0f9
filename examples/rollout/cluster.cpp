// examples/rollout/cluster.cpp — see cluster.hpp.
#include "examples/rollout/cluster.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include "blobpipe/cluster/router.hpp"
#include "blobpipe/cluster/server.hpp"
#include "examples/rollout/check.hpp"
#include "examples/rollout/error_text.hpp"
#include "examples/rollout/listener.hpp"
#include "examples/rollout/reporting.hpp"

// -Wmismatched-new-delete (GCC 11 and later) is a false positive on asio's
// coroutine frames, here and in co_spawn: see workers.cpp.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace rollout {
namespace {

using clock = std::chrono::steady_clock;
using blobpipe::server_event_kind;

std::size_t group_of(std::size_t n, const options& o) { return n / o.group_size; }
std::size_t rank_of_group(std::size_t g, const options& o) { return g % o.trainers; }
std::size_t groups_in(const options& o) { return (o.batch + o.group_size - 1) / o.group_size; }
std::uint32_t members_of(std::size_t g, const options& o) {
  return static_cast<std::uint32_t>(std::min(o.group_size, o.batch - g * o.group_size));
}

/// One rank: its server, its check, what it saw.
struct rank_state {
  blobpipe::server srv;
  std::unique_ptr<checker> check;
  std::uint64_t groups_expected = 0, groups_complete = 0, groups_aborted = 0;
  std::optional<clock::time_point> first;  // its first entry
  clock::time_point last{};                // its last event
  blobpipe::server_stats stats;
  bool done = false;
};

asio::awaitable<void> serve_rank(rank_state& r) {
  for (;;) {
    auto ev = co_await r.srv.next();
    if (ev.kind == server_event_kind::end_of_stream) break;
    const std::size_t conn = ev.connection ? ev.connection->id : 0;
    switch (ev.kind) {
      case server_event_kind::entry_ready:
        if (!r.first) r.first = clock::now();
        r.check->on_entry(conn, *ev.ev.entry);
        break;
      case server_event_kind::blob_complete:
        r.check->on_blob(conn, *ev.ev.blob, ev.ev.tag);
        break;
      case server_event_kind::blob_aborted:
        if (!ev.ev.resend) r.check->on_aborted(conn, ev.ev);
        break;
      case server_event_kind::group_complete: ++r.groups_complete; break;
      case server_event_kind::group_aborted: ++r.groups_aborted; break;
      default: break;
    }
    r.last = clock::now();
  }
  r.stats = r.srv.stats();
}

struct worker_result {
  std::error_code ec;
  std::string what;  // one line when ec
  std::uint64_t blobs = 0;
  blobpipe::router_stats stats;
};

// Worker `id`: samples id, id + W, ... each to its group's rank.
asio::awaitable<worker_result> run_routed_worker(std::vector<std::string> urls, const options& o,
                                                 std::size_t id, const sample_builder& builder) {
  worker_result res;
  const std::string who = "worker " + std::to_string(id) + ": ";
  auto ex = co_await asio::this_coro::executor;
  blobpipe::router_options ropt;
  ropt.policy = blobpipe::route_policy::by_rank;
  ropt.sender.stall_timeout = timeout_ms(o);
  auto [ec, rt] = co_await blobpipe::router::start(ex, std::move(urls), ropt);
  if (ec) {
    res.ec = ec;
    res.what = who + "connect: " + error_text(ec);
    co_return res;
  }
  for (std::size_t n = id; n < o.batch; n += o.workers) {
    const std::size_t g = group_of(n, o);
    const sample smp = builder.make(static_cast<std::int64_t>(n));
    auto b = rt.open_blob({.tag = blobpipe::random_tag(),
                           .group = blobpipe::blob_group{g, members_of(g, o)},
                           .rank = g});
    if (!b) {
      res.ec = b.code();
      res.what = who + "sample " + std::to_string(n) + ": " + b.message();
      co_return res;
    }
    for (const field& f : fields(smp)) {
      if (auto e = co_await b->blob.emit(f.key, f.value)) {
        res.ec = e;
        res.what = who + "emit " + f.key + " to rank " + std::to_string(b->destination) + ": " +
                   error_text(e, b->blob.last_error());
        co_return res;
      }
    }
    if (auto e = co_await b->blob.finish()) {
      res.ec = e;
      res.what = who + "finish sample " + std::to_string(n) + ": " + error_text(e);
      co_return res;
    }
    ++res.blobs;
  }
  if (auto e = co_await rt.shutdown()) {
    res.ec = e;
    res.what = who + "shutdown: " + error_text(e);
  }
  res.stats = rt.stats();
  co_return res;
}

std::string ms(std::uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(ns) / 1e6);
  return buf;
}

std::string rate(std::uint64_t bytes, double secs) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MB in %.3f s, %.1f MB/s", static_cast<double>(bytes) / 1e6,
                secs, secs > 0 ? static_cast<double>(bytes) / 1e6 / secs : 0.0);
  return buf;
}

std::string latency(const blobpipe::latency_histogram& h) {
  return "entry latency p50 " + ms(h.percentile(0.5)) + " ms, p90 " + ms(h.percentile(0.9)) +
         " ms, p99 " + ms(h.percentile(0.99)) + " ms (" + std::to_string(h.count()) + " entries)";
}

}  // namespace

int run_cluster(const options& o, std::shared_ptr<const sample_builder> builder, std::ostream& out) {
  asio::io_context ctx;
  auto ex = ctx.get_executor();
  blobpipe::server_options sopt;
  sopt.group_timeout = timeout_ms(o);
  std::vector<std::unique_ptr<rank_state>> ranks;
  std::vector<std::string> urls;
  for (std::size_t k = 0; k < o.trainers; ++k) {
    auto srv = blobpipe::server::listen(ex, endpoint_url(o.transport, o.host, 0), sopt);
    if (!srv) {
      std::cerr << "rollout_to_trainer: rank " << k << ": listen: " << srv.message() << "\n";
      return exit_mismatch;
    }
    auto r = std::make_unique<rank_state>();
    r->srv = std::move(*srv);
    r->check = make_batch_check(builder, o.batch, [&o, k](std::size_t n) {
      return rank_of_group(group_of(n, o), o) == k;
    });
    for (std::size_t g = 0; g < groups_in(o); ++g) r->groups_expected += rank_of_group(g, o) == k;
    urls.push_back(r->srv.url());
    ranks.push_back(std::move(r));
  }
  out << "rollout_to_trainer: " << o.workers << " rollout worker(s) -> " << o.trainers
      << " trainer ranks (";
  for (std::size_t k = 0; k < urls.size(); ++k) out << (k ? " " : "") << urls[k];
  out << "), global batch " << o.batch << " samples (5 entries each) in GRPO groups of "
      << o.group_size << ", group g to rank g mod " << o.trainers << "\n"
      << std::flush;

  // The guard: past --timeout every server closes (what is open aborts).
  bool timed_out = false;
  asio::steady_timer guard(ex, timeout_ms(o));
  guard.async_wait([&](std::error_code ec) {
    if (ec) return;
    timed_out = true;
    for (auto& r : ranks) r->srv.close();
  });
  std::size_t ranks_running = ranks.size();
  for (auto& r : ranks) {
    asio::co_spawn(ex, serve_rank(*r), [&, rp = r.get()](std::exception_ptr e) {
      if (e) std::cerr << "rollout_to_trainer: rank: " << exception_text(e) << "\n";
      rp->done = !e;
      if (--ranks_running == 0) guard.cancel();
    });
  }

  const auto t0 = clock::now();
  std::size_t running = o.workers;
  bool failed = false;
  std::uint64_t blobs = 0;
  blobpipe::endpoint_metrics sent;
  for (std::size_t w = 0; w < o.workers; ++w) {
    asio::co_spawn(ex, run_routed_worker(urls, o, w, *builder),
                   [&, w](std::exception_ptr e, worker_result r) {
                     if (e) {
                       r.ec = blobpipe::errc::aborted;
                       r.what = "worker " + std::to_string(w) + ": " + exception_text(e);
                     }
                     if (r.ec) {
                       std::cerr << r.what << "\n";
                       failed = true;
                     }
                     blobs += r.blobs;
                     sent.merge(r.stats.total);
                     // The last worker done: the ranks end once their
                     // connections have.
                     if (--running == 0)
                       for (auto& rk : ranks) rk->srv.stop_accepting();
                   });
  }
  ctx.run();

  bool ok = !failed && !timed_out;
  blobpipe::endpoint_metrics total;
  std::uint64_t groups_complete = 0;
  clock::time_point end = t0;
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    rank_state& r = *ranks[k];
    out << "rank " << k << " (" << urls[k] << "):\n";
    const bool rank_ok = r.check->report(out) && r.done;
    const auto& t = r.stats.total;
    const double secs =
        r.first ? std::chrono::duration<double>(r.last - *r.first).count() : 0.0;
    out << "  rank " << k << ": " << rate(t.bytes, secs) << ", " << r.stats.accepted
        << " connection(s), groups complete " << r.groups_complete << "/" << r.groups_expected;
    if (r.groups_aborted) out << " (" << r.groups_aborted << " aborted)";
    out << ", " << latency(t.latency) << "\n";
    ok = ok && rank_ok && r.groups_complete == r.groups_expected && r.groups_aborted == 0;
    total.merge(t);
    groups_complete += r.groups_complete;
    end = std::max(end, r.last);
  }
  const double secs = std::chrono::duration<double>(end - t0).count();
  out << "total: " << rate(total.bytes, secs) << " over " << o.trainers << " ranks, groups complete "
      << groups_complete << "/" << groups_in(o) << ", " << latency(total.latency);
  if (total.first_entry_s) out << ", first entry after " << ms(static_cast<std::uint64_t>(*total.first_entry_s * 1e9)) << " ms";
  out << "\n"
      << "workers: " << o.workers << " worker(s) sent " << blobs << " blobs, " << sent.entries
      << " entries, " << sent.bytes << " bytes (entries + tails) to " << o.trainers
      << " ranks; waited for credit " << sent.credit_waits << " time(s)\n";
  if (timed_out)
    out << "FAIL: timed out after " << o.timeout_s << " s (--timeout) with "
        << groups_complete << " of " << groups_in(o) << " groups complete\n";
  if (ok)
    out << "OK: " << ranks.front()->check->ok_text() << "; each of " << o.trainers
        << " ranks got exactly its share, and all " << groups_in(o) << " groups completed\n";
  return ok ? exit_ok : exit_mismatch;
}

}  // namespace rollout
