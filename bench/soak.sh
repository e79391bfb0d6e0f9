#!/usr/bin/env bash
# bench/soak.sh [BLOBS] [CUT_EVERY] — the endurance soak (not a test, not in
# CI): BLOBS (default 1,000,000) small blobs from a rollout-worker process
# to a trainer process over TCP on 127.0.0.1, through a resend session; the
# trainer closes its connection every CUT_EVERY blobs (default 100,000), so
# reconnects and resends run too. The trainer prints its RSS at the start
# (after a 1% warm-up) and at the end, and the soak FAILS (exit 1) when the
# end exceeds the start by more than BLOBPIPE_SOAK_RSS_BOUND_KIB (default
# 16384 KiB). Run by hand (minutes); CI does not run it.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/soak.sh [BLOBS] [CUT_EVERY]
       bench/soak.sh --help

The endurance soak (not a test; docs/reliability.md): BLOBS small blobs
(default 1000000) from a rollout-worker process to a trainer process over
TCP on 127.0.0.1, through a resend session; the trainer closes its
connection every CUT_EVERY blobs (default 100000), so reconnects and
resends run too. The trainer prints its RSS after a 1% warm-up and at the
end; the soak fails when the end exceeds the start by more than the bound.
Run by hand: CI does not run it.

BLOBS is a positive decimal integer; CUT_EVERY a decimal integer, 0 for
no cuts (leading zeros are allowed and read as decimal: 010 is ten).
Environment: BLOBPIPE_SOAK_PORT, the trainer's port (default 7811);
BLOBPIPE_SOAK_RSS_BOUND_KIB, the RSS growth allowed from the warm-up to
the end (default 16384 KiB).
Builds //bench:soak with -c opt and leaves the bazel-bin symlinks alone.
Exit status: 0 every blob arrived once and intact and RSS stayed within
the bound; 2 bad usage; any other nonzero: it failed.
EOF
}

for a in "$@"; do
  if [[ $a == -h || $a == --help ]]; then usage; exit 0; fi
done
for a in "$@"; do
  if [[ $a == -* ]]; then
    echo "soak.sh: unknown option '$a'" >&2
    usage >&2
    exit 2
  fi
done
if (($# > 2)); then
  echo "soak.sh: too many arguments" >&2
  usage >&2
  exit 2
fi
# Decimal, leading zeros allowed (010 is ten): decimal() drops them as
# text (no bash arithmetic, which reads 010 as octal and wraps on
# overflow), and soak gets the result.
decimal() { [[ $1 =~ ^0*([0-9]+)$ ]] && echo "${BASH_REMATCH[1]}"; }
blobs=1000000
cut=100000
if (($# >= 1)) && ! { blobs=$(decimal "$1") && [[ $blobs != 0 ]]; }; then
  echo "soak.sh: BLOBS '$1' is not a positive decimal integer" >&2
  usage >&2
  exit 2
fi
if (($# == 2)) && ! cut=$(decimal "$2"); then
  echo "soak.sh: CUT_EVERY '$2' is not a decimal integer" >&2
  usage >&2
  exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
port=${BLOBPIPE_SOAK_PORT:-7811}
bound=${BLOBPIPE_SOAK_RSS_BOUND_KIB:-16384}
if ! [[ $bound =~ ^[0-9]+$ ]]; then
  echo "soak.sh: BLOBPIPE_SOAK_RSS_BOUND_KIB '$bound' is not a decimal integer" >&2
  exit 2
fi
# --symlink_prefix=/ creates no convenience symlinks: an opt build would
# otherwise repoint bazel-bin, which examples/README.md's commands use.
build=(bazel/bazelw build -c opt --symlink_prefix=/ //bench:soak)
"${build[@]}" >/dev/null 2>&1 || "${build[@]}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The opt tree is shared with other builds: run a copy, which no rebuild
# can replace mid-soak.
cp "$(bazel/bazelw info -c opt bazel-bin 2>/dev/null)/bench/soak" "$work/soak"
bin=$work/soak
mkfifo "$work/out"
"$bin" consume "$port" "$blobs" "$cut" "$bound" >"$work/out" &
cpid=$!
exec 3<"$work/out"
read -r line <&3   # "listening": the trainer is ready (a blocking read, no sleep)
[[ $line == listening ]] || { echo "soak: trainer did not start" >&2; exit 1; }
cat <&3 &
catpid=$!
exec 3<&-
status=0
"$bin" produce "$port" "$blobs" || status=$?
wait "$cpid" || status=$?   # the trainer: every blob once, RSS within the bound
wait "$catpid"
if ((status == 0)); then echo "soak: PASSED"; else echo "soak: FAILED (exit $status)"; fi
exit "$status"
