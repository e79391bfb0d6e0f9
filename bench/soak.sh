#!/usr/bin/env bash
# bench/soak.sh [BLOBS] [CUT_EVERY] — the endurance soak (not a test, not in
# CI): BLOBS (default 1,000,000) small blobs from a rollout-worker process
# to a trainer process over TCP on 127.0.0.1, through a resend session; the
# trainer closes its connection every CUT_EVERY blobs (default 100,000), so
# reconnects and resends run too. The trainer prints its RSS at the start
# (after a 1% warm-up) and at the end; they should match within noise.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
blobs=${1:-1000000}
cut=${2:-100000}
port=${BLOBPIPE_SOAK_PORT:-7811}
bazel/bazelw build -c opt //bench:soak >/dev/null 2>&1 || bazel/bazelw build -c opt //bench:soak
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/soak

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkfifo "$work/out"
"$bin" consume "$port" "$blobs" "$cut" >"$work/out" &
cpid=$!
exec 3<"$work/out"
read -r line <&3   # "listening": the trainer is ready (a blocking read, no sleep)
[[ $line == listening ]] || { echo "soak: trainer did not start" >&2; exit 1; }
cat <&3 &
catpid=$!
exec 3<&-
"$bin" produce "$port" "$blobs"
wait "$cpid"
wait "$catpid"
