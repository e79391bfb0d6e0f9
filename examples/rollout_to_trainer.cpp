// examples/rollout_to_trainer.cpp — RL rollout workers stream samples to a
// trainer as NVDP blobs over TCP.
//
//   bazel/bazelw run //examples:rollout_to_trainer                 # all in one process, 2 ranks
//   bazel/bazelw run //examples:rollout_to_trainer -- --trainers 4 --group-size 8
//   bazel/bazelw run //examples:rollout_to_trainer -- --replay ../shared/golden
//   rollout_to_trainer --listen 5555 &  rollout_to_trainer --connect 127.0.0.1:5555
//
// The pieces, one idea per file, are in examples/rollout/: the corpus and
// how a sample is built from it (corpus, sample), the worker and
// trainer coroutines (workers, trainer), and what the trainer checks
// (batch_check, replay_check). This file wires them onto one io_context.
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>

#include "blobpipe/transport/tcp.hpp"
#include "examples/rollout/check.hpp"
#include "examples/rollout/cluster.hpp"
#include "examples/rollout/cpu.hpp"
#include "examples/rollout/corpus.hpp"
#include "examples/rollout/listener.hpp"
#include "examples/rollout/options.hpp"
#include "examples/rollout/replay.hpp"
#include "examples/rollout/reporting.hpp"
#include "examples/rollout/sample.hpp"
#include "examples/rollout/trainer.hpp"
#include "examples/rollout/workers.hpp"
#include "tools/stdout_status.hpp"
#include "tools/user_path.hpp"

namespace {

using namespace rollout;

struct worker_totals {
  std::size_t running = 0;
  std::uint64_t blobs = 0, entries = 0, bytes = 0, credit_waits = 0;
  bool failed = false;
};

void print_replay_set(const replay_set& set, const std::string& dir) {
  std::uint64_t entries = 0, bytes = 0;
  for (const auto& b : set.blobs) {
    entries += b.index.entries.size();
    bytes += b.entry_bytes();
  }
  std::cout << "replay: " << set.blobs.size() << " valid blobs in " << dir << " (" << entries
            << " entries, " << bytes << " bytes)";
  if (set.skipped.empty()) {
    std::cout << "; no invalid ones\n";
  } else {
    std::cout << "; skipping " << set.skipped.size() << " invalid:\n";
  }
  for (const auto& s : set.skipped) std::cout << "  skip " << s << "\n";
}

// Each connection costs a descriptor at either end it has in this process
// (UCX a few more). Asking for more than the process may open would end in
// failed accepts and connects stuck in the kernel's retries, so raise the
// soft limit as far as the hard one allows, or say why not.
std::optional<std::string> check_descriptor_budget(const options& o) {
  const rlim_t ends = o.mode == role::both ? 2 : 1;      // connection ends in this process
  const rlim_t per_end = o.transport == "ucx" ? 4 : 1;  // UCX: sockets, event fds
  const rlim_t spare = 64;                              // stdio, the listener, UCX's own
  // Each worker connects to every trainer rank (--trainers; a --listen
  // process serves at most that many).
  const rlim_t need = static_cast<rlim_t>(o.workers * o.trainers) * ends * per_end + spare;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY ||
      lim.rlim_cur >= need)
    return std::nullopt;
  if (lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= need) {
    lim.rlim_cur = need;
    if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) return std::nullopt;
  }
  return "--workers " + std::to_string(o.workers) + " x --trainers " + std::to_string(o.trainers) +
         " (every worker connects to every rank) needs about " + std::to_string(need) +
         " file descriptors; this process may open " + std::to_string(lim.rlim_cur) +
         " (hard limit " + std::to_string(lim.rlim_max) + "; see ulimit -n)";
}

// SIGINT and SIGTERM end the run early with a summary of what arrived;
// a SIGINT the shell had us ignore (a background job) stays ignored.
void watch_signals(asio::io_context& ctx, asio::signal_set& signals,
                   const std::shared_ptr<trainer>& tr, int& status, bool& interrupted) {
  add_stop_signals(signals);
  signals.async_wait([&ctx, &signals, &status, &interrupted, tr](std::error_code ec, int signo) {
    if (ec) return;
    interrupted = true;
    status = 128 + signo;
    // A second signal acts as usual (ends the process at once).
    std::error_code ignored;
    signals.clear(ignored);
    const std::string name = signal_name(signo);
    if (tr) {
      tr->interrupt(name);
    } else {
      std::cerr << "rollout_to_trainer: interrupted by " << name << "\n";
      ctx.stop();  // destroying the workers' frames closes their connections
    }
  });
}

// Which side's CPU time this process reports (cpu.hpp).
std::string who(const options& o) {
  switch (o.mode) {
    case role::trainer: return "trainer";
    case role::workers: return "workers";
    default: return "trainer and workers";
  }
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int run(const options& o) {
  const auto start = std::chrono::steady_clock::now();
  if (auto why = check_descriptor_budget(o)) {
    std::cerr << "rollout_to_trainer: " << *why << "\n";
    return exit_usage;
  }
  std::shared_ptr<const replay_set> replay;
  std::shared_ptr<const sample_builder> builder;
  if (o.replay_dir) {
    // Under `bazel run`, relative to where the user typed the command.
    auto set = load_replay(blobpipe::cli::user_path(*o.replay_dir));
    if (!set) {
      std::cerr << "rollout_to_trainer: --replay " << set.message() << "\n";
      return exit_usage;
    }
    replay = std::make_shared<const replay_set>(std::move(*set));
    print_replay_set(*replay, *o.replay_dir);
    if (replay->blobs.empty()) {
      std::cerr << "rollout_to_trainer: --replay " << *o.replay_dir
                << ": no valid *.blob file to replay\n";
      return exit_usage;
    }
  } else {
    builder = std::make_shared<const sample_builder>(corpus::embedded(), o.seq_len);
  }
  // K trainer ranks, each a fan-in server, groups routed by rank (in this
  // process, or named by --listen/--connect URL lists).
  if (cluster_shape(o)) {
    const int status = run_cluster(o, builder, std::cout);
    if (status != exit_usage)
      print_cpu(std::cout, who(o), since(start), o.mode != role::workers, o.mode != role::trainer);
    return status;
  }

  asio::io_context ctx;
  auto ex = ctx.get_executor();
  int status = exit_ok;
  bool interrupted = false;
  asio::signal_set signals(ctx);
  std::uint16_t port = o.port;
  std::string host = o.host;

  // Workers of their own (--connect): a HOST that no retry can reach (a
  // name that does not resolve, an address the transport refuses) is a
  // bad command line, said before any worker starts.
  if (o.mode == role::workers) {
    if (auto ok = check_connect_host(ex, o.host, o.transport); !ok) {
      std::cerr << "rollout_to_trainer: --connect: " << ok.message() << "\n";
      return exit_usage;
    }
  }

  // Trainer: listens (port 0 = ephemeral), then consumes every connection.
  std::shared_ptr<trainer> tr;
  if (o.mode != role::workers) {
    // A host name listens on its address (blobpipe::listen resolves it).
    auto l = blobpipe::listen(ex, endpoint_url(o.transport, o.host, o.port));
    if (!l) {
      // A name that does not resolve, an address the transport refuses
      // (UCX: IPv6) is a bad command line; one it cannot bind (in use, not
      // this host's) a failure to run.
      std::cerr << "rollout_to_trainer: --listen: " << l.message() << "\n";
      return l.code() == blobpipe::errc::invalid_argument ? exit_usage : exit_mismatch;
    }
    host = (*l)->endpoint().host;
    port = (*l)->port();
    auto check = replay ? make_replay_check(replay) : make_batch_check(builder, o.batch, {}, o.check);
    trainer_config cfg{.connections = o.workers,
                       .timeout = timeout_ms(o),
                       .tty = stdout_is_tty(),
                       .remote_workers = o.mode == role::trainer};
    tr = std::make_shared<trainer>(ex, std::move(*l), std::move(check), cfg, std::cout);
    // Nothing a coroutine throws is lost: the trainer's exception fails
    // the run with its text (its connections have reported their own).
    asio::co_spawn(ex, tr->run(), [&](std::exception_ptr e, bool ok) {
      if (e) std::cerr << "rollout_to_trainer: trainer: " << exception_text(e) << "\n";
      if ((e || !ok) && !interrupted) status = exit_mismatch;
      std::error_code ignored;
      signals.cancel(ignored);
    });
  }
  watch_signals(ctx, signals, tr, status, interrupted);

  std::cout << "rollout_to_trainer: " << o.workers << " rollout worker(s) -> trainer, "
            << o.transport << " " << host_port(host, port) << ", ";
  if (replay) {
    std::cout << "replaying " << replay->blobs.size() << " blobs\n";
  } else {
    std::cout << "global batch " << o.batch << " samples (5 entries each) from "
              << corpus::embedded().size() << " prompt/response pairs\n";
  }
  std::cout << std::flush;

  // Workers: one connection each; when the last one ends, the trainer
  // stops waiting for connections that will never come.
  worker_totals totals;
  if (o.mode != role::trainer) {
    totals.running = o.workers;
    for (std::size_t w = 0; w < o.workers; ++w) {
      worker_config cfg{.host = o.host, .port = port, .transport = o.transport, .id = w, .count = o.workers,
                        .batch = o.batch, .replay = replay,
                        .stall_timeout = timeout_ms(o),
                        .remote_trainer = o.mode == role::workers,
                        .corrupt_sample = o.corrupt_sample, .drop_entry = o.drop_entry};
      asio::co_spawn(ex, run_worker(ex, cfg, builder),
                     [&, tr, w](std::exception_ptr e, worker_report r) {
                       if (e) {  // a failed worker, like one whose connection failed
                         r.ec = blobpipe::errc::aborted;
                         r.what = "worker " + std::to_string(w) + ": " + exception_text(e);
                       }
                       if (r.ec && !interrupted) {
                         std::cerr << r.what << "\n";
                         totals.failed = true;
                       }
                       totals.blobs += r.blobs;
                       totals.entries += r.stats.entries_sent;
                       totals.bytes += r.stats.bytes_sent;
                       totals.credit_waits += r.stats.credit_waits;
                       if (--totals.running == 0) {
                         if (tr) tr->stop_accepting();
                         std::error_code ignored;
                         if (o.mode == role::workers) signals.cancel(ignored);
                       }
                     });
    }
  }

  ctx.run();

  if (o.mode == role::workers && interrupted) {
    // A worker reports its counts when it ends; the others were cut off
    // mid-stream, so only the trainer knows what they delivered.
    std::cout << "workers: interrupted before " << totals.running << " of " << o.workers
              << " connection(s) finished; the trainer reports what arrived\n";
  } else if (o.mode != role::trainer) {
    std::cout << "workers: " << o.workers << " connection(s) sent " << totals.blobs
              << " blobs, " << totals.entries << " entries, " << totals.bytes
              << " bytes (entries + tails); waited for window credit " << totals.credit_waits
              << " time(s)\n";
    if (totals.failed && !interrupted) status = exit_mismatch;
  }
  print_cpu(std::cout, who(o), since(start), o.mode != role::workers && !o.replay_dir,
            o.mode != role::trainer && !o.replay_dir);
  return status;
}

int program(int argc, char** argv) {
  auto parsed = parse_options(argc, argv);
  if (auto* e = std::get_if<usage_error>(&parsed)) {
    std::cerr << "rollout_to_trainer: " << e->message << "\n";
    return exit_usage;
  }
  const options& o = std::get<options>(parsed);
  if (o.help) {
    // One buffer holds the whole text (over stdio's 4 KiB), so a write
    // that fails does so in finish_stdout's flush, which names the reason.
    static char buffer[1 << 14];
    std::setvbuf(stdout, buffer, _IOFBF, sizeof buffer);
    std::cout << help_text();
    return exit_ok;
  }
  try {
    return run(o);
  } catch (const std::exception& ex) {
    // Only unexpected failures get here; stream problems are values.
    std::cerr << "rollout_to_trainer: " << ex.what() << "\n";
    return exit_mismatch;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return blobpipe::cli::finish_stdout("rollout_to_trainer", program(argc, argv), exit_mismatch);
}
