// examples/rollout/cluster.hpp — the main job at cluster shape: K trainer
// ranks, each a fan-in server (blobpipe::server), and rollout workers that
// route every GRPO group to one rank (blobpipe::router, by rank).
//
// Samples gG .. gG+G-1 are GRPO group g (G = --group-size; the last group
// may be smaller) and go to rank g mod K, from whichever worker built them
// (worker w builds samples w, w + W, ...), so a group's members reach its
// rank on several connections and the rank's server reports the group
// complete. Every rank checks that it got exactly its share, each entry
// by its digest or byte for byte (--check; make_batch_check with the
// rank's samples), and the run prints per-rank and total throughput,
// entry latency percentiles (emit -> entry_ready, one host), the groups
// completed, and the steady-state rate over the ranks here.
//
// The ranks and the workers run in one process (role::both, ephemeral
// ports), or apart: a --listen URL[,URL...] process runs ranks R, R+1, ...
// (--rank R) and ends once --workers senders have come and gone (or its
// share is complete and no sender is left); a --connect URL[,URL...]
// process runs the workers, each a resend session to every rank (retried
// while the ranks start). Every process computes the shares from the same
// options. A progress line shows the samples in; SIGINT or SIGTERM ends
// the run with the summary of what arrived (exit 128 + the signal).
//
//   return rollout::run_cluster(o, builder, std::cout);   // cluster_shape(o)
#pragma once

#include <memory>
#include <ostream>

#include "examples/rollout/options.hpp"
#include "examples/rollout/sample.hpp"

namespace rollout {

/// Runs this process's part of the cluster-shaped job (o.mode: ranks and
/// workers, ranks only at o.listen_urls, workers only towards
/// o.connect_urls) and reports on `out` (errors on std::cerr). Returns
/// exit_ok when every rank here got exactly its share and every group of
/// theirs completed (workers only: every blob was delivered),
/// exit_mismatch otherwise, exit_usage for a --listen URL it cannot listen
/// on or a --connect host that does not resolve, 128 + the signal when
/// interrupted. REQUIRES: cluster_shape(o), o.group_size >= 1, builder set.
int run_cluster(const options& o, std::shared_ptr<const sample_builder> builder, std::ostream& out);

}  // namespace rollout
