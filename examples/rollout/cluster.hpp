// examples/rollout/cluster.hpp — the main job at cluster shape: K trainer
// ranks, each a fan-in server (blobpipe::server), and rollout workers that
// route every GRPO group to one rank (blobpipe::router, by rank).
//
// Samples gG .. gG+G-1 are GRPO group g (G = --group-size; the last group
// may be smaller) and go to rank g mod K, from whichever worker built them
// (worker w builds samples w, w + W, ...), so a group's members reach its
// rank on several connections and the rank's server reports the group
// complete. Every rank checks that it got exactly its share, byte for
// byte (make_batch_check with the rank's samples), and the run prints
// per-rank and total throughput, entry latency percentiles (emit ->
// entry_ready, one host) and the groups completed.
//
//   return rollout::run_cluster(o, builder, std::cout);   // o.trainers > 1
#pragma once

#include <memory>
#include <ostream>

#include "examples/rollout/options.hpp"
#include "examples/rollout/sample.hpp"

namespace rollout {

/// Runs o.trainers ranks and o.workers workers in this process over
/// o.transport on o.host (ephemeral ports) and reports on `out` (errors on
/// std::cerr). Returns exit_ok when every rank got exactly its share and
/// every group completed, exit_mismatch otherwise.
/// REQUIRES: o.trainers >= 1, o.group_size >= 1, builder set.
int run_cluster(const options& o, std::shared_ptr<const sample_builder> builder, std::ostream& out);

}  // namespace rollout
