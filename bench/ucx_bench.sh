#!/usr/bin/env bash
# bench/ucx_bench.sh — blobpipe frames over UCX next to ucx_perftest.
#
# For each UCX_TLS in TLS_LIST, runs on 127.0.0.1, interleaved REPEAT times
# (server, then client, same -s SIZE -n ITERS -w WARMUP for every tool):
#   ucx_perftest -t tag_bw    -e   } with peer error handling, as
#   ucx_perftest -t stream_bw -e   } blobpipe's endpoints
#   ucx_perftest -t tag_bw         } without it
#   ucx_perftest -t stream_bw      }
#   ucx_raw_bench                  raw UCP connected as blobpipe is
#                                  (//bench:ucx_raw_bench: endpoints from
#                                  worker addresses, RAW_CONNECT=listener:
#                                  from UCX's sockaddr listener, which
#                                  blobpipe does not use; peer error
#                                  handling, one active message per
#                                  frame; no blobpipe, no Asio; polling)
#   ucx_bench --server / --client  blobpipe (//bench:ucx_bench), as an
#                                  application runs it (busy_poll 200 us)
#   ucx_bench ... --busy-poll 1000000  the same, polling like ucx_perftest
#   ucx_bench ... --pipeline ENTRY     the whole pipeline (blobpipe::sender
#                                  to blobpipe::consumer, defaults): entries
#                                  of ENTRY bytes in SIZE-byte data frames,
#                                  SIZE * ITERS bytes in all, each entry
#                                  dropped on arrival; timed by the consumer
# and prints every run, then the best of each in MB/s (MB = 2^20 bytes,
# ucx_perftest's unit) and blobpipe's ratio to the best ucx_perftest
# figure of the four, against the target 0.90. The raw column is not a
# target: blobpipe / raw is what blobpipe's own layers cost, raw / the
# best ucx_perftest figure what UCX charges for the connection style.
#
# Why four: blobpipe's endpoints use UCP_ERR_HANDLING_MODE_PEER, so that a
# dead peer is reported instead of hanging (docs/ucx.md), and UCX 1.13
# selects lanes differently for such endpoints, also depending on how
# they were connected. ucx_perftest connects by exchanging worker
# addresses, as blobpipe does: with -e its tcp endpoint keeps only the lo
# rail, as blobpipe's does; without -e, lo and eth0 (UCX_LOG_LEVEL=info
# prints each endpoint's "ep_cfg"). Over shared memory posix, sysv and cma take
# part under peer error handling only with MM_ERROR_HANDLING and
# MEMORY_INVALIDATE, which blobpipe sets and this script sets for
# ucx_perftest too. No single ucx_perftest mode is blobpipe's twin, so the
# reference is the best of them.
#
#   bench/ucx_bench.sh                 # 1 MiB messages, 10000 of them
#   SIZE=4194304 ITERS=2500 TLS_LIST="tcp" bench/ucx_bench.sh
#
# Environment: SIZE (bytes, 1048576), ITERS (10000: a run lasts seconds;
# with 2000, 0.2 s, one scheduling hiccup moved a result by 30% on a small
# VM), WARMUP (100), WINDOW (sends outstanding, blobpipe and raw, 8), RX_WINDOW
# (blobpipe payload fetches outstanding, transport::post_payload, 16 as
# consumer_options::payload_window),
# RX_BUFFERS (receive buffers used in turn, 1 as in ucx_perftest),
# ENTRY (bytes per entry in the pipeline column; SIZE: one data frame
# per entry, like one ucx_perftest message),
# RAW_CONNECT (address: as blobpipe connects; listener: UCX's sockaddr
# listener, which blobpipe does not use: docs/ucx.md "Connecting"),
# REPEAT (3), TLS_LIST ("tcp sm,tcp"), PORT (first port used, 13500),
# PIN (1: receivers on CPU 0, senders on CPU 1, for both tools; 0: off).
# Reports, never gates on the figures; but every run must produce one: the
# exit status is 1 when any run failed (its figure is then "-" in the run's
# line, and the summary still prints the best of the others).
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
if [[ $# -gt 0 ]]; then
  # --help / -h: the text above on stdout, exit 0. Anything else is an
  # error (settings come from the environment): say which, help on stderr.
  if [[ $# -eq 1 && ( "$1" == -h || "$1" == --help ) ]]; then
    usage
    exit 0
  fi
  bad=${2-}  # only repeated --help / -h; else the first other argument
  for a in "$@"; do
    if [[ "$a" != -h && "$a" != --help ]]; then bad=$a; break; fi
  done
  echo "ucx_bench.sh: unknown argument '$bad'" >&2
  usage >&2
  exit 2
fi

SIZE=${SIZE:-1048576}
ITERS=${ITERS:-10000}
WARMUP=${WARMUP:-100}
WINDOW=${WINDOW:-8}
RX_WINDOW=${RX_WINDOW:-16}
RX_BUFFERS=${RX_BUFFERS:-1}
RAW_CONNECT=${RAW_CONNECT:-address}
ENTRY=${ENTRY:-$SIZE}
REPEAT=${REPEAT:-3}
TLS_LIST=${TLS_LIST:-"tcp sm,tcp"}
PORT=${PORT:-13500}
PIN=${PIN:-1}

# Pinning the two ends apart keeps the scheduler from stacking them on one
# core, which otherwise moves results by 2x on a small machine.
server_cpu=() client_cpu=()
if [[ "$PIN" == 1 && $(nproc) -ge 2 ]] && command -v taskset >/dev/null; then
  server_cpu=(taskset -c 0) client_cpu=(taskset -c 1)
fi

cd "$(dirname "$0")/.."
if ! command -v ucx_perftest >/dev/null; then
  echo "ucx_perftest not found (Debian: ucx-utils)" >&2
  exit 1
fi
# --symlink_prefix=/ creates no convenience symlinks: an opt build would
# otherwise repoint bazel-bin, which examples/README.md's commands use.
bazel/bazelw build -c opt --symlink_prefix=/ //bench:ucx_bench //bench:ucx_raw_bench >&2
# The opt tree is shared with other builds: copy the binaries out of it.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=$(bazel/bazelw info -c opt bazel-bin 2>/dev/null)/bench
cp "$bin/ucx_bench" "$bin/ucx_raw_bench" "$work/"

# The shared-memory settings blobpipe applies under peer error handling
# (lib/transport/ucx/handles.cpp), given to ucx_perftest as well.
export UCX_MM_ERROR_HANDLING=${UCX_MM_ERROR_HANDLING:-y}
export UCX_CMA_MEMORY_INVALIDATE=${UCX_CMA_MEMORY_INVALIDATE:-y}

# run_failed WHAT CLIENT_OUTPUT SERVER_LOG: says why a run gave no figure.
run_failed() {
  {
    echo "$1: no result; client:"
    tail -n 5 <<<"$2" | sed 's/^/    /'
    echo "  server:"
    tail -n 5 "$3" | sed 's/^/    /'
  } >&2
}

# perftest TEST TLS PORT [-e] -> overall bandwidth, MB/s
perftest() {
  local test=$1 tls=$2 port=$3 out
  local extra=("${@:4}")
  UCX_TLS=$tls timeout 120 "${server_cpu[@]}" ucx_perftest -t "$test" -s "$SIZE" -n "$ITERS" \
    -w "$WARMUP" -p "$port" "${extra[@]}" >"$work/server.log" 2>&1 &
  local server=$!
  # The client fails at once while the server is not listening yet.
  for _ in $(seq 100); do
    if out=$(UCX_TLS=$tls timeout 120 "${client_cpu[@]}" ucx_perftest 127.0.0.1 -t "$test" \
               -s "$SIZE" -n "$ITERS" -w "$WARMUP" -p "$port" "${extra[@]}" 2>&1); then
      break
    fi
    out=""
    sleep 0.1
  done
  wait "$server" || true
  # "Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall"
  awk '/Final:/ {print $7}' <<<"$out"
  grep -q 'Final:' <<<"$out" || run_failed "ucx_perftest $test $tls" "$out" "$work/server.log"
}

# ucx_bench_pair TLS PORT PREFIX [ARGS...] -> MB/s: //bench:ucx_bench as
# server and client, ARGS given to both (each end ignores the other's);
# the figure is on the line starting with PREFIX, printed by the client
# (frames: blobpipe-ucx) or the server (--pipeline: blobpipe-pipeline).
ucx_bench_pair() {
  local tls=$1 port=$2 prefix=$3 out
  local extra=("${@:4}")
  UCX_TLS=$tls timeout 120 "${server_cpu[@]}" "$work/ucx_bench" --server --port "$port" \
    --size "$SIZE" --iters "$ITERS" --warmup "$WARMUP" "${extra[@]}" >"$work/bp_server.log" 2>&1 &
  local server=$!
  out=$(UCX_TLS=$tls timeout 120 "${client_cpu[@]}" "$work/ucx_bench" --client 127.0.0.1 \
          --port "$port" --size "$SIZE" --iters "$ITERS" --warmup "$WARMUP" "${extra[@]}" 2>&1) ||
    true
  wait "$server" || true
  local both
  both=$(printf '%s\n' "$out"; cat "$work/bp_server.log")
  sed -n "s/^$prefix .*: \([0-9.]*\) MB\/s.*/\1/p" <<<"$both"
  grep -q "^$prefix " <<<"$both" || run_failed "ucx_bench ${extra[*]} $tls" "$out" "$work/bp_server.log"
}

# blobpipe TLS PORT BUSY_POLL_US -> MB/s (frames)
blobpipe() {
  ucx_bench_pair "$1" "$2" blobpipe-ucx --window "$WINDOW" --rx-window "$RX_WINDOW" \
    --rx-buffers "$RX_BUFFERS" --busy-poll "$3"
}

# pipeline TLS PORT -> MB/s (the consumer's figure)
pipeline() { ucx_bench_pair "$1" "$2" blobpipe-pipeline --pipeline "$ENTRY"; }

# raw TLS PORT -> MB/s
raw() {
  local tls=$1 port=$2 out
  UCX_TLS=$tls timeout 120 "${server_cpu[@]}" "$work/ucx_raw_bench" --server --port "$port" \
    --size "$SIZE" --iters "$ITERS" --warmup "$WARMUP" --connect "$RAW_CONNECT" \
    >"$work/raw_server.log" 2>&1 &
  local server=$!
  # The client fails at once while the server is not listening yet.
  for _ in $(seq 100); do
    if out=$(UCX_TLS=$tls timeout 120 "${client_cpu[@]}" "$work/ucx_raw_bench" --client \
               127.0.0.1 --port "$port" --size "$SIZE" --iters "$ITERS" --warmup "$WARMUP" \
               --window "$WINDOW" --connect "$RAW_CONNECT" 2>&1); then
      break
    fi
    # Failed after connecting, or before (the server not up yet: retry).
    grep -q 'ucp_ep_flush_nbx\|not listening yet' <<<"$out" || break
    sleep 0.1
  done
  wait "$server" || true
  sed -n 's/^ucx-raw .*: \([0-9.]*\) MB\/s.*/\1/p' <<<"$out"
  grep -q '^ucx-raw ' <<<"$out" || run_failed "ucx_raw_bench $tls" "$out" "$work/raw_server.log"
}

best() { printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | tail -1; }

pinned=${server_cpu:+; receivers on CPU 0, senders on CPU 1}
printf 'message size %s bytes, %s iterations (+%s warm-up), best of %s; blobpipe window %s, rx window %s, rx buffers %s; pipeline entries of %s bytes; raw connected by %s%s\n' \
  "$SIZE" "$ITERS" "$WARMUP" "$REPEAT" "$WINDOW" "$RX_WINDOW" "$RX_BUFFERS" "$ENTRY" "$RAW_CONNECT" "$pinned"
summary=()
failed_runs=()
for tls in $TLS_LIST; do
  tag=() stream=() tag_plain=() stream_plain=() rawr=() bp=() spin=() pipe=()
  for i in $(seq "$REPEAT"); do
    # A fresh port each run (the last may linger in TIME_WAIT), counted
    # here: a $(...) subshell cannot move PORT.
    tag+=("$(perftest tag_bw "$tls" "$PORT" -e)")
    stream+=("$(perftest stream_bw "$tls" $((PORT + 1)) -e)")
    tag_plain+=("$(perftest tag_bw "$tls" $((PORT + 2)))")
    stream_plain+=("$(perftest stream_bw "$tls" $((PORT + 3)))")
    rawr+=("$(raw "$tls" $((PORT + 4)))")
    bp+=("$(blobpipe "$tls" $((PORT + 5)) 200)")
    spin+=("$(blobpipe "$tls" $((PORT + 6)) 1000000)")
    pipe+=("$(pipeline "$tls" $((PORT + 7)))")
    PORT=$((PORT + 8))
    # A run that printed no figure failed (run_failed said why on stderr).
    names=("tag_bw -e" "stream_bw -e" "tag_bw" "stream_bw" raw blobpipe spin pipeline)
    figures=("${tag[-1]}" "${stream[-1]}" "${tag_plain[-1]}" "${stream_plain[-1]}" \
             "${rawr[-1]}" "${bp[-1]}" "${spin[-1]}" "${pipe[-1]}")
    for k in "${!figures[@]}"; do
      [[ ${figures[k]} =~ ^[0-9.]+$ ]] || failed_runs+=("$tls run $i: ${names[k]}")
    done
    printf '  %-8s run %s: tag_bw -e %s, stream_bw -e %s, tag_bw %s, stream_bw %s, raw %s, blobpipe %s, spin %s, pipeline %s\n' \
      "$tls" "$i" "${figures[0]:--}" "${figures[1]:--}" "${figures[2]:--}" "${figures[3]:--}" \
      "${figures[4]:--}" "${figures[5]:--}" "${figures[6]:--}" "${figures[7]:--}"
  done
  t=$(best "${tag[@]}") s=$(best "${stream[@]}") n=$(best "${tag_plain[@]}")
  m=$(best "${stream_plain[@]}") w=$(best "${rawr[@]}") b=$(best "${bp[@]}")
  p=$(best "${spin[@]}") e=$(best "${pipe[@]}")
  if [[ -z "$t" || -z "$s" || -z "$n" || -z "$m" || -z "$w" || -z "$b" || -z "$p" || -z "$e" ]]; then
    echo "$tls: a run failed (tag_bw -e '$t', stream_bw -e '$s', tag_bw '$n'," \
      "stream_bw '$m', raw '$w', blobpipe '$b', spin '$p', pipeline '$e')" >&2
    exit 1
  fi
  summary+=("$(awk -v tls="$tls" -v t="$t" -v s="$s" -v n="$n" -v m="$m" -v w="$w" -v b="$b" \
                   -v p="$p" -v e="$e" 'BEGIN {
    ref = t; if (s > ref) ref = s; if (n > ref) ref = n; if (m > ref) ref = m;
    r = b / ref; q = p / ref;
    printf "%-8s %10.1f %10.1f %10.1f %10.1f %10.1f %5.2fx %10.1f %6.2fx %-4s %10.1f %6.2fx %-4s %10.1f %5.2fx",
           tls, t, s, n, m, w, w / ref, b, r, (r >= 0.90 ? "PASS" : "MISS"), p, q,
           (q >= 0.90 ? "PASS" : "MISS"), e, e / ref
  }')")
done
printf '%-8s %10s %10s %10s %10s %10s %6s %10s %12s %10s %12s %10s %6s\n' "UCX_TLS" "tag_bw -e" \
  "stream -e" "tag_bw" "stream" "raw" "ratio" "blobpipe" "ratio" "spin" "ratio" "pipeline" \
  "ratio"
printf '%s\n' "${summary[@]}"
echo "(best of $REPEAT, MB/s, MB = 2^20 bytes; ratio = column / the best ucx_perftest column,"
echo " target >= 0.90 for blobpipe; raw: UCP connected as blobpipe is, no blobpipe (a reference,"
echo " not a target); blobpipe: event-driven default (busy_poll 200 us); spin: busy_poll 1 s;"
echo " pipeline: sender to consumer, entries of $ENTRY bytes, as an application receives them)"
if ((${#failed_runs[@]})); then
  echo "ucx_bench: FAILED: ${#failed_runs[@]} run(s) produced no figure:" >&2
  printf '  %s\n' "${failed_runs[@]}" >&2
  exit 1
fi
