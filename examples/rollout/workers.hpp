// examples/rollout/workers.hpp — the rollout-worker side: one TCP
// connection per worker, one blob per sample (or per replayed file).
//
// A worker connects, runs the sender handshake, then streams its share of
// the work: samples id, id + count, id + 2*count, ... below the batch size
// (or, with a replay set, those blobs of the set). Each entry goes out as
// soon as it is emitted; the sender's window makes a worker wait when the
// trainer falls behind. At the end the worker closes the connection in
// order (sender::shutdown), so the trainer sees a clean end of stream.
//
//   auto report = co_await rollout::run_worker(ex, cfg, builder);
//   if (report.ec) std::cerr << report.what << "\n";
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>
#include <string>
#include <system_error>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/pipeline/producer.hpp"
#include "examples/rollout/replay.hpp"
#include "examples/rollout/sample.hpp"

namespace rollout {

struct worker_config {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::string transport = "tcp";  ///< "tcp" or "ucx"
  std::size_t id = 0;      ///< this worker's number, < count
  std::size_t count = 1;   ///< how many workers share the work
  std::size_t batch = 0;   ///< samples in the global batch
  /// When set, stream these blobs instead of samples (and ignore batch).
  std::shared_ptr<const replay_set> replay;
  /// A refused connection is retried for this long: the trainer may be a
  /// second process that is still starting.
  std::chrono::milliseconds connect_patience{5000};
  /// The worker gives up (timed_out) when the trainer takes nothing for
  /// this long (sender_options::stall_timeout); 0: never.
  std::chrono::milliseconds stall_timeout{0};
  /// The trainer runs in another process (--connect): a connection it
  /// drops before its hello may mean it was given fewer --workers, and one
  /// nobody accepts that it is not running; the messages say so only then.
  bool remote_trainer = false;
  /// For tests of the trainer's check (options::corrupt_sample,
  /// options::drop_entry): damage this sample, or leave out its token_mask.
  std::optional<std::size_t> corrupt_sample, drop_entry;
};

/// The sample's entries as a worker emits them: fields(s), less the
/// token_mask of sample `drop` (a test of the trainer's check).
/// REQUIRES: as fields(s).
std::vector<field> fields_to_send(const sample& s, std::optional<std::size_t> drop);

struct worker_report {
  std::error_code ec;     ///< empty when everything was sent and closed in order
  std::string what;       ///< one line naming the step that failed
  std::uint64_t blobs = 0;
  blobpipe::sender_stats stats;
};

/// Runs one worker to the end. Never throws for connection problems.
/// REQUIRES: builder set unless cfg.replay is; both outlive the call.
asio::awaitable<worker_report> run_worker(asio::any_io_executor ex, worker_config cfg,
                                          std::shared_ptr<const sample_builder> builder);

}  // namespace rollout
