// examples/rollout/cluster.cpp — see cluster.hpp.
#include "examples/rollout/cluster.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>

#include "blobpipe/cluster/router.hpp"
#include "blobpipe/cluster/server.hpp"
#include "examples/rollout/check.hpp"
#include "examples/rollout/cpu.hpp"
#include "examples/rollout/error_text.hpp"
#include "examples/rollout/workers.hpp"
#include "examples/rollout/listener.hpp"
#include "examples/rollout/progress.hpp"
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

// Workers of another process (--connect URL...) are resend sessions, so a
// rank still starting is retried: 100 ms doubling to 1 s, ten attempts,
// about 5.5 s in all when nothing listens (as the single trainer's workers
// wait 5 s). A rank that accepts and never answers costs each attempt its
// handshake bound as well: the message says how long the worker tried and
// the bound (blobpipe::resend_give_up_bound), not a fixed figure.
constexpr std::uint32_t remote_connect_attempts = 10;
constexpr auto remote_retry_delay = std::chrono::milliseconds(100);
constexpr auto remote_max_retry_delay = std::chrono::milliseconds(1000);

/// One rank: its server, its check, what it saw.
struct rank_state {
  std::size_t rank = 0;  // 0 .. K-1
  blobpipe::server srv;
  std::string url;
  std::unique_ptr<checker> check;
  std::uint64_t groups_expected = 0, groups_complete = 0, groups_aborted = 0;
  std::uint64_t blobs_without_group = 0;    // completed blobs that named no group
  std::set<blobpipe::session_id> sessions;  // resend sessions seen
  std::size_t plain_senders = 0;            // connections without one
  std::size_t open = 0;                     // connections open now
  std::optional<clock::time_point> first;  // its first entry
  clock::time_point last{};                // its last event
  blobpipe::server_stats stats;
  bool done = false;

  // Senders seen: a resend session that reconnects is one sender.
  std::size_t senders() const { return sessions.size() + plain_senders; }
  bool share_done() const {
    return check->done() == check->total() &&
           groups_complete + groups_aborted == groups_expected;
  }
};

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
  const bool remote = o.mode == role::workers;
  if (remote) {
    ropt.resend = true;
    ropt.sender.resend.max_attempts = remote_connect_attempts;
    ropt.sender.resend.retry_delay = remote_retry_delay;
    ropt.sender.resend.max_retry_delay = remote_max_retry_delay;
  }
  const auto began = std::chrono::steady_clock::now();
  auto [ec, rt] = co_await blobpipe::router::start(ex, urls, ropt);
  // What the retries took, and their bound, for the messages below.
  auto tried = [&] {
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    const double bound = blobpipe::resend_give_up_bound(ropt.sender).count() / 1e3;
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "%u attempts in %.1f s (at most %.1f s: each up to %.1f s, waits 0.1 s "
                  "doubling to 1 s)",
                  remote_connect_attempts, took, bound,
                  (ropt.sender.stall_timeout.count() > 0
                       ? std::min(ropt.sender.stall_timeout, ropt.sender.handshake_timeout)
                       : ropt.sender.handshake_timeout)
                          .count() / 1e3);
    return std::string(buf);
  };
  // Every rank must be reached: a rank missing would fail its share.
  for (std::size_t d = 0; !ec && d < rt.size(); ++d) {
    if (auto e = rt.error(d)) {
      res.ec = e;
      const std::string& why = rt.failure_reason(d);
      res.what = who + "connect to rank " + std::to_string(d) + " (" + urls[d] + "): " +
                 error_text(e, !remote ? why
                               : "gave up after " + tried() +
                                     (why.empty() ? "; is that rank listening and answering?"
                                                  : ": " + why));
      rt.close();
      co_return res;
    }
  }
  if (ec) {
    // Each rank's own reason, where the router kept one.
    std::string why = remote ? "no rank could be reached: gave up after " + tried() +
                                   "; are they listening?"
                             : std::string();
    for (std::size_t d = 0; d < rt.size(); ++d) {
      const std::string& reason = rt.failure_reason(d);
      if (reason.empty()) continue;
      why += (why.empty() ? "rank " : "; rank ") + std::to_string(d) + ": " + reason;
    }
    res.ec = ec;
    res.what = who + "connect: " + error_text(ec, why);
    co_return res;
  }
  // On an error the loop ends and the router closes; its stats (what did
  // go out before) are reported either way.
  for (std::size_t n = id; !res.ec && n < o.batch; n += o.workers) {
    const std::size_t g = group_of(n, o);
    sample smp;
    {
      cpu_scope building(app_cpu().build_s);
      smp = builder.make(static_cast<std::int64_t>(n));
      if (o.corrupt_sample == n) corrupt(smp);
    }
    auto b = rt.open_blob({.tag = blobpipe::random_tag(),
                           .group = blobpipe::blob_group{g, members_of(g, o)},
                           .rank = g});
    if (!b) {
      res.ec = b.code();
      res.what = who + "sample " + std::to_string(n) + ": " + b.message();
      break;
    }
    for (const field& f : fields_to_send(smp, o.drop_entry)) {
      if (auto e = co_await b->blob.emit(f.key, f.value)) {
        res.ec = e;
        res.what = who + "emit " + f.key + " to rank " + std::to_string(b->destination) + ": " +
                   error_text(e, b->blob.last_error());
        break;
      }
    }
    if (res.ec) break;
    if (auto e = co_await b->blob.finish()) {
      res.ec = e;
      res.what = who + "finish sample " + std::to_string(n) + ": " +
                 error_text(e, rt.failure_reason(b->destination));
      break;
    }
    ++res.blobs;
  }
  if (res.ec) {
    rt.close();
  } else if (auto e = co_await rt.shutdown()) {
    res.ec = e;
    std::string why;  // the first gone destination's reason
    for (std::size_t d = 0; why.empty() && d < rt.size(); ++d)
      if (rt.error(d)) why = rt.failure_reason(d);
    res.what = who + "shutdown: " + error_text(e, why);
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

/// This process's part of the job, on one io_context: its ranks (none with
/// --connect), its workers (none with --listen), the --timeout guard over
/// the ranks, the signals, the progress line, and the summary.
class cluster_job {
 public:
  cluster_job(const options& o, std::shared_ptr<const sample_builder> b, std::ostream& out)
      : o_(o),
        builder_(std::move(b)),
        out_(out),
        guard_(ctx_, timeout_ms(o)),
        signals_(ctx_),
        progress_(out, stdout_is_tty(), "ranks") {}

  int run() {
    if (o_.mode != role::workers) {
      if (auto status = open_ranks()) return *status;
    } else if (auto status = check_hosts()) {
      return *status;
    }
    // Signals first: a caller may signal as soon as it reads the banner.
    add_stop_signals(signals_);
    signals_.async_wait([this](std::error_code ec, int signo) {
      if (!ec) interrupt(signo);
    });
    print_banner();
    start_ranks();
    start_workers();
    ctx_.run();
    progress_.finish();
    bool ok = ranks_.empty() || report_ranks();
    if (o_.mode != role::trainer) ok = report_workers() && ok;
    if (!interrupted_.empty()) {
      out_ << "FAIL: interrupted by " << interrupted_ << "\n";
      return status_;
    }
    if (ok && !ranks_.empty()) print_ok();
    return ok ? exit_ok : exit_mismatch;
  }

 private:
  bool ranks_here() const { return o_.mode != role::workers; }

  // Listens for this process's ranks; a status to exit with when it cannot.
  std::optional<int> open_ranks() {
    blobpipe::server_options sopt;
    sopt.group_timeout = timeout_ms(o_);
    const std::size_t n = o_.listen_urls.empty() ? o_.trainers : o_.listen_urls.size();
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = o_.first_rank + i;
      const std::string where =
          o_.listen_urls.empty() ? endpoint_url(o_.transport, o_.host, 0) : o_.listen_urls[i];
      auto srv = blobpipe::server::listen(ctx_.get_executor(), where, sopt);
      if (!srv) {
        std::cerr << "rollout_to_trainer: rank " << k << ": listen at " << where << ": "
                  << srv.message() << "\n";
        // A name that does not resolve is a bad command line; a port in
        // use a failure to run.
        return srv.code() == blobpipe::errc::invalid_argument ? exit_usage : exit_mismatch;
      }
      auto r = std::make_unique<rank_state>();
      r->rank = k;
      r->srv = std::move(*srv);
      r->url = r->srv.url();
      r->check = make_batch_check(
          builder_, o_.batch,
          [o = o_, k](std::size_t s) { return rank_of_group(group_of(s, o), o) == k; }, o_.check);
      for (std::size_t g = 0; g < groups_in(o_); ++g) r->groups_expected += rank_of_group(g, o_) == k;
      urls_.push_back(r->url);
      ranks_.push_back(std::move(r));
    }
    return std::nullopt;
  }

  // --connect URL...: a host no retry can reach is a bad command line.
  std::optional<int> check_hosts() {
    urls_ = o_.connect_urls;
    for (const auto& url : urls_) {
      const auto u = blobpipe::parse_url(url);  // parsed by parse_options already
      if (auto ok = check_connect_host(ctx_.get_executor(), u->host, blobpipe::scheme_name(u->scheme));
          !ok) {
        std::cerr << "rollout_to_trainer: --connect " << url << ": " << ok.message() << "\n";
        return exit_usage;
      }
    }
    return std::nullopt;
  }

  void print_banner() {
    out_ << "rollout_to_trainer: ";
    if (o_.mode == role::trainer) {
      out_ << "trainer rank" << (ranks_.size() > 1 ? "s " : " ") << ranks_.front()->rank;
      if (ranks_.size() > 1) out_ << "-" << ranks_.back()->rank;
      out_ << " of " << o_.trainers << " at";
      for (const auto& u : urls_) out_ << " " << u;
      out_ << ", expecting " << o_.workers << " worker(s)";
    } else {
      out_ << o_.workers << " rollout worker(s) -> " << o_.trainers << " trainer ranks (";
      for (std::size_t k = 0; k < urls_.size(); ++k) out_ << (k ? " " : "") << urls_[k];
      out_ << ")";
    }
    out_ << ", global batch " << o_.batch << " samples (5 entries each) in GRPO groups of "
         << o_.group_size << ", group g to rank g mod " << o_.trainers << "\n"
         << std::flush;
  }

  void start_ranks() {
    if (ranks_.empty()) return;
    // The guard: past --timeout every server closes (what is open aborts).
    guard_.async_wait([this](std::error_code ec) {
      if (ec) return;
      timed_out_ = true;
      for (auto& r : ranks_) r->srv.close();
    });
    ranks_running_ = ranks_.size();
    for (auto& r : ranks_) {
      ++running_;
      asio::co_spawn(ctx_, serve(*r), [this, rp = r.get()](std::exception_ptr e) {
        if (e) std::cerr << "rollout_to_trainer: rank " << rp->rank << ": " << exception_text(e) << "\n";
        rp->done = !e;
        if (--ranks_running_ == 0) guard_.cancel();
        finished();
      });
    }
  }

  void start_workers() {
    if (o_.mode == role::trainer) return;
    workers_running_ = o_.workers;
    for (std::size_t w = 0; w < o_.workers; ++w) {
      ++running_;
      asio::co_spawn(ctx_, run_routed_worker(urls_, o_, w, *builder_),
                     [this, w](std::exception_ptr e, worker_result r) {
                       if (e) {
                         r.ec = blobpipe::errc::aborted;
                         r.what = "worker " + std::to_string(w) + ": " + exception_text(e);
                       }
                       if (r.ec && interrupted_.empty()) {
                         std::cerr << r.what << "\n";
                         workers_failed_ = true;
                       }
                       blobs_ += r.blobs;
                       sent_.merge(r.stats.total);
                       // The last worker done: the ranks here end once
                       // their connections have.
                       if (--workers_running_ == 0)
                         for (auto& rk : ranks_) rk->srv.stop_accepting();
                       finished();
                     });
    }
  }

  // One coroutine (a rank or a worker) ended; after the last, nothing
  // waits for a signal any more.
  void finished() {
    if (--running_ == 0) {
      std::error_code ignored;
      signals_.cancel(ignored);
    }
  }

  asio::awaitable<void> serve(rank_state& r) {
    for (;;) {
      auto ev = co_await r.srv.next();
      if (ev.kind == server_event_kind::end_of_stream) break;
      on_event(r, ev);
      r.last = clock::now();
      update_progress();
    }
    r.stats = r.srv.stats();
  }

  void on_event(rank_state& r, const blobpipe::server_event& ev) {
    const std::size_t conn = ev.connection ? ev.connection->id : 0;
    switch (ev.kind) {
      case server_event_kind::connection_opened:
        if (!first_sender_) {
          first_sender_ = true;
          progress_.restart();
        }
        ++r.open;
        if (ev.connection->session == blobpipe::NO_SESSION) {
          ++r.plain_senders;
        } else {
          r.sessions.insert(ev.connection->session);
        }
        break;
      case server_event_kind::connection_closed:
        --r.open;
        break;
      case server_event_kind::entry_ready: {
        if (!r.first) r.first = clock::now();
        cpu_scope checking(app_cpu().check_s);
        r.check->on_entry(conn, *ev.ev.entry);
        break;
      }
      case server_event_kind::blob_complete:
        r.check->on_blob(conn, *ev.ev.blob, ev.ev.tag);
        if (!ev.ev.group) ++r.blobs_without_group;
        break;
      case server_event_kind::blob_aborted:
        if (!ev.ev.resend) r.check->on_aborted(conn, ev.ev);
        break;
      case server_event_kind::group_complete: ++r.groups_complete; break;
      case server_event_kind::group_aborted: ++r.groups_aborted; break;
      default: break;
    }
    // Workers of another process: the rank ends once every sender it
    // expects (--workers) has come and gone, or its share is in and no
    // sender is left (a worker with no sample for this rank may never
    // come).
    if (o_.mode == role::trainer && r.open == 0 && (r.senders() >= o_.workers || r.share_done()))
      r.srv.stop_accepting();
  }

  void update_progress() {
    std::uint64_t done = 0, total = 0, entries = 0, bytes = 0;
    for (const auto& r : ranks_) {
      done += r->check->done();
      total += r->check->total();
      entries += r->check->entries();
      bytes += r->check->bytes();
    }
    progress_.update(done, total, "samples", entries, bytes);
    steady_.update(done, total, bytes);
  }

  // SIGINT or SIGTERM: the ranks here close (their open blobs abort) and
  // report what had arrived; workers of their own stop where they are.
  void interrupt(int signo) {
    interrupted_ = signal_name(signo);
    status_ = 128 + signo;
    std::error_code ignored;
    signals_.clear(ignored);  // a second signal ends the process at once
    std::cerr << "rollout_to_trainer: interrupted by " << interrupted_ << "\n";
    if (ranks_.empty()) {
      ctx_.stop();  // destroying the workers' frames closes their connections
      return;
    }
    guard_.cancel();
    for (auto& r : ranks_) r->srv.close();
  }

  bool report_ranks() {
    bool ok = !timed_out_ && !workers_failed_;
    blobpipe::endpoint_metrics total;
    std::uint64_t groups_complete = 0, groups_expected = 0;
    clock::time_point begin = clock::time_point::max(), end{};
    for (auto& rp : ranks_) {
      rank_state& r = *rp;
      out_ << "rank " << r.rank << " (" << r.url << "):\n";
      const bool rank_ok = r.check->report(out_) && r.done;
      const auto& t = r.stats.total;
      const double secs = r.first ? std::chrono::duration<double>(r.last - *r.first).count() : 0.0;
      out_ << "  rank " << r.rank << ": " << rate(t.bytes, secs) << ", " << r.stats.accepted
           << " connection(s), groups complete " << r.groups_complete << "/" << r.groups_expected;
      if (r.groups_aborted) out_ << " (" << r.groups_aborted << " aborted)";
      out_ << ", " << latency(t.latency) << "\n";
      const bool groups_ok = r.groups_complete == r.groups_expected && r.groups_aborted == 0;
      if (!groups_ok && !timed_out_) {
        out_ << "FAIL: rank " << r.rank << ": " << r.groups_complete << " of " << r.groups_expected
             << " groups complete";
        if (r.groups_aborted) out_ << ", " << r.groups_aborted << " aborted";
        if (r.blobs_without_group)
          out_ << "; " << r.blobs_without_group
               << " blob(s) named no group (blob_group): its workers must send each sample "
                  "with its GRPO group, as this program's --connect workers do";
        out_ << "\n";
      }
      ok = ok && rank_ok && groups_ok;
      total.merge(t);
      groups_complete += r.groups_complete;
      groups_expected += r.groups_expected;
      if (r.first) begin = std::min(begin, *r.first);
      end = std::max(end, r.last);
    }
    const double secs =
        begin < end ? std::chrono::duration<double>(end - begin).count() : 0.0;
    out_ << "total: " << rate(total.bytes, secs) << " over " << ranks_.size()
         << (ranks_.size() > 1 ? " ranks" : " rank") << ", groups complete " << groups_complete << "/" << groups_expected << ", "
         << latency(total.latency);
    if (total.first_entry_s)
      out_ << ", first entry after " << ms(static_cast<std::uint64_t>(*total.first_entry_s * 1e9))
           << " ms";
    out_ << "\n" << steady_.text() << "\n";
    if (timed_out_) {
      out_ << "FAIL: timed out after " << o_.timeout_s << " s (--timeout) with " << groups_complete
           << " of " << groups_expected << " groups complete";
      if (o_.mode == role::trainer) {
        std::size_t senders = 0;
        for (const auto& r : ranks_) senders = std::max(senders, r->senders());
        out_ << "; " << senders << " of the " << o_.workers
             << " worker(s) expected (--workers) connected";
      }
      out_ << "\n";
    }
    groups_expected_ = groups_expected;
    return ok;
  }

  bool report_workers() {
    if (!interrupted_.empty() && o_.mode == role::workers) {
      out_ << "workers: interrupted before " << workers_running_ << " of " << o_.workers
           << " worker(s) finished; the ranks report what arrived\n";
      return false;
    }
    out_ << "workers: " << o_.workers << " worker(s) sent " << blobs_ << " blobs, "
         << sent_.entries << " entries, " << sent_.bytes << " bytes (entries + tails) to "
         << o_.trainers << " ranks; waited for credit " << sent_.credit_waits << " time(s)";
    if (sent_.reconnects) out_ << ", reconnected " << sent_.reconnects << " time(s)";
    out_ << "\n";
    return !workers_failed_;
  }

  void print_ok() {
    out_ << "OK: " << ranks_.front()->check->ok_text() << "; ";
    if (o_.mode == role::both) {
      out_ << "each of " << o_.trainers << " ranks got exactly its share, and all "
           << groups_expected_ << " groups completed\n";
      return;
    }
    out_ << (ranks_.size() > 1 ? "ranks" : "rank");
    for (const auto& r : ranks_) out_ << " " << r->rank;
    out_ << " of " << o_.trainers << " got exactly " << (ranks_.size() > 1 ? "their" : "its")
         << " share, and all " << groups_expected_ << " of " << (ranks_.size() > 1 ? "their" : "its")
         << " groups completed\n";
  }

  const options& o_;
  std::shared_ptr<const sample_builder> builder_;
  std::ostream& out_;
  asio::io_context ctx_;
  asio::steady_timer guard_;
  asio::signal_set signals_;
  progress progress_;
  steady_rate steady_;  // over the ranks here
  std::vector<std::unique_ptr<rank_state>> ranks_;
  std::vector<std::string> urls_;  // the ranks' URLs, in rank order (here or remote)
  std::size_t running_ = 0, ranks_running_ = 0, workers_running_ = 0;
  bool timed_out_ = false, workers_failed_ = false, first_sender_ = false;
  std::string interrupted_;  // the signal's name
  int status_ = exit_ok;
  std::uint64_t blobs_ = 0, groups_expected_ = 0;
  blobpipe::endpoint_metrics sent_;
};

}  // namespace

int run_cluster(const options& o, std::shared_ptr<const sample_builder> builder, std::ostream& out) {
  cluster_job job(o, std::move(builder), out);
  return job.run();
}

}  // namespace rollout
