// examples/rollout_to_trainer.cpp — RL rollout workers stream samples to a
// trainer as NVDP blobs over TCP.
//
//   bazel/bazelw run //examples:rollout_to_trainer                 # all in one process
//   bazel/bazelw run //examples:rollout_to_trainer -- --replay ../shared/golden
//   rollout_to_trainer --listen 5555 &  rollout_to_trainer --connect 127.0.0.1:5555
//
// The pieces, one idea per file, are in examples/rollout/: the corpus and
// how a sample is built from it (corpus, sample, pickle), the worker and
// trainer coroutines (workers, trainer), and what the trainer checks
// (batch_check, replay_check). This file wires them onto one io_context.
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/tcp.hpp"
#include "examples/rollout/check.hpp"
#include "examples/rollout/corpus.hpp"
#include "examples/rollout/options.hpp"
#include "examples/rollout/replay.hpp"
#include "examples/rollout/sample.hpp"
#include "examples/rollout/trainer.hpp"
#include "examples/rollout/workers.hpp"

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
            << " entries, " << bytes << " bytes); skipping " << set.skipped.size()
            << " invalid:\n";
  for (const auto& s : set.skipped) std::cout << "  skip " << s << "\n";
}

// `bazel run` starts the program in its runfiles tree; a relative path
// the user typed is relative to where they typed it.
std::string user_path(const std::string& p) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (!cwd || !*cwd || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::path(cwd) / p).string();
}

int run(const options& o) {
  std::shared_ptr<const replay_set> replay;
  std::shared_ptr<const sample_builder> builder;
  if (o.replay_dir) {
    auto set = load_replay(user_path(*o.replay_dir));
    if (!set) {
      std::cerr << "rollout_to_trainer: --replay " << set.message() << "\n";
      return exit_usage;
    }
    replay = std::make_shared<const replay_set>(std::move(*set));
    print_replay_set(*replay, *o.replay_dir);
  } else {
    builder = std::make_shared<const sample_builder>(corpus::embedded());
  }

  asio::io_context ctx;
  auto ex = ctx.get_executor();
  int status = exit_ok;
  std::uint16_t port = o.port;

  // Trainer: listens (port 0 = ephemeral), then consumes every connection.
  std::shared_ptr<trainer> tr;
  if (o.mode != role::workers) {
    auto l = listen_transport(ex, o.transport, o.port, o.host);
    if (!l) {
      std::cerr << "rollout_to_trainer: listen on " << o.host << ":" << o.port << ": "
                << l.message() << "\n";
      return exit_mismatch;
    }
    port = (*l)->port();
    auto check = replay ? make_replay_check(replay) : make_batch_check(builder, o.batch);
    trainer_config cfg{.connections = o.workers,
                       .timeout = std::chrono::milliseconds(static_cast<long>(o.timeout_s * 1e3)),
                       .tty = stdout_is_tty()};
    tr = std::make_shared<trainer>(ex, std::move(*l), std::move(check), cfg, std::cout);
    asio::co_spawn(ex, tr->run(), [&status](std::exception_ptr e, bool ok) {
      if (e) std::rethrow_exception(e);
      if (!ok) status = exit_mismatch;
    });
  }

  std::cout << "rollout_to_trainer: " << o.workers << " rollout worker(s) -> trainer, "
            << o.transport << " " << o.host << ":" << port << ", ";
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
                        .stall_timeout = std::chrono::milliseconds(static_cast<long>(o.timeout_s * 1e3))};
      asio::co_spawn(ex, run_worker(ex, cfg, builder),
                     [&, tr](std::exception_ptr e, worker_report r) {
                       if (e) std::rethrow_exception(e);
                       if (r.ec) {
                         std::cerr << r.what << "\n";
                         totals.failed = true;
                       }
                       totals.blobs += r.blobs;
                       totals.entries += r.stats.entries_sent;
                       totals.bytes += r.stats.bytes_sent;
                       totals.credit_waits += r.stats.credit_waits;
                       if (--totals.running == 0 && tr) tr->stop_accepting();
                     });
    }
  }

  ctx.run();

  if (o.mode != role::trainer) {
    std::cout << "workers: " << o.workers << " connection(s) sent " << totals.blobs
              << " blobs, " << totals.entries << " entries, " << totals.bytes
              << " bytes (entries + tails); waited for window credit " << totals.credit_waits
              << " time(s)\n";
    if (totals.failed) status = exit_mismatch;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = parse_options(argc, argv);
  if (auto* e = std::get_if<usage_error>(&parsed)) {
    std::cerr << "rollout_to_trainer: " << e->message << "\n";
    return exit_usage;
  }
  const options& o = std::get<options>(parsed);
  if (o.help) {
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
