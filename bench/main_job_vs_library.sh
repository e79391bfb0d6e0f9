#!/usr/bin/env bash
# bench/main_job_vs_library.sh — the main job at cluster shape against the
# library over one connection, in the same run (docs/performance.md
# "Fan-in"). Each of ROUNDS rounds (default 3):
#   1. a fan-in rank, `rollout_to_trainer --listen tcp://127.0.0.1:0
#      --workers W --batch B --seq-len T`, fed by W workers in another
#      process (`--connect tcp://127.0.0.1:PORT`, the same W, B and T):
#      the rank's MB/s as it prints it (first to last entry, every entry
#      checked by digest);
#   2. the library's RL samples of the same T over one TCP connection
#      (`cluster_bench --senders 1 --process-runs 1`, its "1 sender, 1
#      connection" phase: the public API, the consumer dropping each
#      entry, first to last entry);
# then the rank's rate over the library's, per round and the median.
# Run it on a quiet machine: both sides share its cores.
#
#   bench/main_job_vs_library.sh                      # W 16, B 8192, T 4096
#   ROUNDS=5 WORKERS=16 BATCH=8192 SEQ_LEN=4096 bench/main_job_vs_library.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
WORKERS=${WORKERS:-16}
BATCH=${BATCH:-8192}
SEQ_LEN=${SEQ_LEN:-4096}
bazel/bazelw build -c opt //examples:rollout_to_trainer //bench:cluster_bench >&2
bin=$(bazel/bazelw info -c opt bazel-bin 2>/dev/null)
job=$bin/examples/rollout_to_trainer
lib=$bin/bench/cluster_bench
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shape=(--workers "$WORKERS" --batch "$BATCH" --seq-len "$SEQ_LEN" --timeout 600)
ratios=()
echo "main job at cluster shape (1 rank, $WORKERS worker connections, $BATCH samples of $SEQ_LEN tokens) against the library over one TCP connection; $ROUNDS rounds"
for round in $(seq 1 "$ROUNDS"); do
  "$job" --listen tcp://127.0.0.1:0 "${shape[@]}" >"$work/rank" 2>&1 &
  rank=$!
  port=
  for _ in $(seq 1 300); do
    port=$(grep -m1 -oE 'tcp://127\.0\.0\.1:[0-9]+' "$work/rank" | sed 's/.*://' || true)
    [[ -n $port ]] && break
    sleep 0.1
  done
  if [[ -z $port ]]; then
    echo "round $round: the rank named no port:" >&2; cat "$work/rank" >&2; kill "$rank" 2>/dev/null; exit 1
  fi
  if ! "$job" --connect "tcp://127.0.0.1:$port" "${shape[@]}" >"$work/workers" 2>&1; then
    echo "round $round: the workers failed:" >&2; cat "$work/workers" >&2
    kill "$rank" 2>/dev/null || true
  fi
  if ! wait "$rank"; then
    echo "round $round: the rank failed:" >&2; cat "$work/rank" >&2; exit 1
  fi
  # Outputs to files first, then read: a grep that stops early must not
  # break the writer's pipe, and a missing line must reach the message below.
  "$lib" --senders 1 --process-runs 1 --samples "$BATCH" --seq-len "$SEQ_LEN" >"$work/lib" 2>&1 || true
  rank_mbps=$( (grep -m1 -oE '^  rank 0: [0-9.]+ [kMG]?B in [0-9.]+ s, [0-9.]+ MB/s' "$work/rank" |
                grep -oE '[0-9.]+ MB/s$' | cut -d' ' -f1) || true)
  lib_gbps=$( (grep -m1 -E '^round 1  1 sender, 1 connection' "$work/lib" |
               grep -oE '[0-9.]+ GB/s' | cut -d' ' -f1) || true)
  if [[ -z $rank_mbps || -z $lib_gbps ]]; then
    echo "round $round: no rate read (rank '$rank_mbps' MB/s, library '$lib_gbps' GB/s)" >&2; exit 1
  fi
  ratio=$(awk -v a="$rank_mbps" -v b="$lib_gbps" 'BEGIN { printf "%.2f", a / (b * 1000) }')
  ratios+=("$ratio")
  printf 'round %d  main job %8.1f MB/s  library %8.1f MB/s  main job / library %sx\n' \
    "$round" "$rank_mbps" "$(awk -v b="$lib_gbps" 'BEGIN { print b * 1000 }')" "$ratio"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
echo "median over $ROUNDS rounds: main job / library ${median}x (target >= 0.8)"
