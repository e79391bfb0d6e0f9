#!/usr/bin/env bash
# bench/cluster_bench.sh — fan-in across processes and cores: the fan-in
# server alone in one process, its senders in others (//bench:cluster_bench
# run again as --send), ROUNDS interleaved rounds (default 5) of
#   1 sender on 1 connection                 (1 receive thread)
#   SENDERS senders (default 16)             (1 receive thread)
#   SENDERS senders                          (THREADS receive threads, default 2)
#   the raw-socket floor, 1 and SENDERS connections (no protocol)
# each printing bytes/s (first to last entry) and the server's CPU per
# byte (getrusage of the server's process), then the medians: fan-in over
# one connection (bytes/s, and CPU per byte against the target <= 1.1x),
# the raw socket's own fan-in cost, THREADS receive threads over 1, and
# what 16 cores would move from the per-thread CPU figures. Run it on a quiet machine: the
# senders share its cores with the server. Extra arguments go to
# cluster_bench (--samples N, --seq-len T, --budget-mb M, --stream-kb K).
#
#   bench/cluster_bench.sh                       # 5 rounds, 16 senders, 1 vs 2 threads
#   ROUNDS=7 SENDERS=8 THREADS=2 bench/cluster_bench.sh --samples 4096
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
SENDERS=${SENDERS:-16}
THREADS=${THREADS:-2}
exec bazel/bazelw run -c opt //bench:cluster_bench -- --senders "$SENDERS" \
  --threads "$THREADS" --process-runs "$ROUNDS" "$@"
