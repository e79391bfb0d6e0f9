#!/usr/bin/env bash
# bench/performance.sh — the one command behind docs/performance.md: runs
# every benchmark the page quotes, keeps their raw output, redraws the plot
# and prints the page's tables (docs/performance.md "Machine and the command").
#
#   bench/performance.sh                 # the full run, on a quiet machine (about 30 min)
#   bench/performance.sh --quick         # small counts, one repeat: checks that it runs
#   bench/performance.sh --out DIR       # raw output there (default docs/perf)
#   bench/performance.sh --repeats N     # entry_sizes N times (default 3; each cell is already
#                                        # best of 3 interleaved runs), the best kept
#
# From the repository root. It builds, with -c opt and --symlink_prefix=/
# (bazel-bin keeps pointing where the examples' commands expect),
# //bench:entry_sizes and //python:blobpipe, then runs:
#   1. bench/entry_sizes --cpu --csv (blobpipe over TCP and in process,
#      ZeroMQ defaults and tuned, the raw socket columns), --repeats times;
#   2. bench/python_stream.py (blobpipe from Python against pyzmq and C++);
#   3. bench/python_bench.py --only codec and --only percall (the codec
#      against the reference: $BLOBPIPE_REFERENCE, by default
#      ../shared/reference/blob_format.py beside the clone);
#   4. bench/ucx_bench.sh (blobpipe over UCX against ucx_perftest), when
#      ucx_perftest is installed;
# writes into DIR: entry_sizes.txt, entry_sizes_<r>.csv, entry_sizes.csv (the
# best of the repeats), python_stream.txt, python_codec.txt, ucx_bench.txt,
# machine.txt, performance_tables.md, and entry_sizes.svg when gnuplot is
# installed (bench/plot_entry_sizes.sh); and prints the machine and the
# tables (bench/performance_tables.py) to paste into docs/performance.md.
# Nothing else should run meanwhile: no build, no test, no other benchmark.
# The exit status is 0 unless a benchmark failed to run; figures never gate.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
out=docs/perf
repeats=""
while (($#)); do
  case $1 in
    --quick) quick=1 ;;
    --out) out=${2:?--out DIR}; shift ;;
    --repeats) repeats=${2:?--repeats N}; shift ;;
    -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "performance.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $repeats ]] || repeats=$((quick ? 1 : 3))
mkdir -p "$out"
py=/usr/bin/python3
failed=()

say() { printf '\n== %s\n' "$*" >&2; }

say "build (-c opt)"
bazel/bazelw build -c opt --symlink_prefix=/ //bench:entry_sizes //python:blobpipe >&2
bin=$(bazel/bazelw info -c opt bazel-bin 2>/dev/null)

{
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with local changes)')"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) hardware threads"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2}') GiB"
  echo "os: $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
  echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "mode: $([[ $quick == 1 ]] && echo '--quick (small counts: the figures mean nothing)' || echo full), entry_sizes repeats: $repeats"
} > "$out/machine.txt"
cat "$out/machine.txt" >&2

quick_flag=()
[[ $quick == 1 ]] && quick_flag=(--quick)

say "entry_sizes, $repeats time(s)"
: > "$out/entry_sizes.txt"
csvs=()
for ((r = 1; r <= repeats; r++)); do
  echo "== repeat $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> "$out/entry_sizes.txt"
  if ! "$bin/bench/entry_sizes" "${quick_flag[@]}" --cpu --csv "$out/entry_sizes_$r.csv" \
      | tee -a "$out/entry_sizes.txt" >&2; then
    failed+=("entry_sizes (repeat $r)")
  fi
  csvs+=(--csv "$out/entry_sizes_$r.csv")
done

say "python_stream.py (blobpipe from Python against pyzmq)"
stream_args=(--reps 3)
[[ $quick == 1 ]] && stream_args=(--quick --reps 1)
PYTHONPATH=$bin/python${PYTHONPATH:+:$PYTHONPATH} "$py" bench/python_stream.py "${stream_args[@]}" \
  2>&1 | tee "$out/python_stream.txt" >&2 || failed+=(python_stream.py)

say "python_bench.py (the codec against the reference)"
if [[ -z ${BLOBPIPE_REFERENCE:-} && -f ../shared/reference/blob_format.py ]]; then
  export BLOBPIPE_REFERENCE=$PWD/../shared/reference/blob_format.py
fi
[[ -n ${BLOBPIPE_REFERENCE:-} ]] || echo "no reference: set BLOBPIPE_REFERENCE (its rows print SKIP)" >&2
: > "$out/python_codec.txt"
for section in codec percall; do
  PYTHONPATH=$bin/python${PYTHONPATH:+:$PYTHONPATH} "$py" bench/python_bench.py --only $section "${quick_flag[@]}" \
    2>&1 | tee -a "$out/python_codec.txt" >&2 || failed+=("python_bench.py --only $section")
done

say "ucx_bench.sh (UCX against ucx_perftest)"
if command -v ucx_perftest >/dev/null; then
  ucx_env=()
  [[ $quick == 1 ]] && ucx_env=(ITERS=200 REPEAT=1)
  env "${ucx_env[@]}" bench/ucx_bench.sh 2>&1 | tee "$out/ucx_bench.txt" >&2 || failed+=(ucx_bench.sh)
else
  echo "skipped: ucx_perftest not found (Debian: apt-get install ucx-utils)" | tee "$out/ucx_bench.txt" >&2
fi

"$py" bench/performance_tables.py "${csvs[@]}" --merged-csv "$out/entry_sizes.csv" \
  --python-stream "$out/python_stream.txt" > "$out/performance_tables.md"

say "plot"
if command -v gnuplot >/dev/null; then
  bench/plot_entry_sizes.sh "$out/entry_sizes.csv" "$out/entry_sizes.svg" >&2 || failed+=(plot_entry_sizes.sh)
else
  echo "not redrawn: gnuplot not found (apt-get install --no-install-recommends gnuplot-nox); $out/entry_sizes.svg left as it was" >&2
fi

echo "## Machine and the command"
echo
sed 's/^/    /' "$out/machine.txt"
echo
echo "## Entry sizes over TCP"
echo
cat "$out/performance_tables.md"
echo
echo "raw output and CSV: $out/ (UCX: $out/ucx_bench.txt; the codec: $out/python_codec.txt)"
if ((${#failed[@]})); then
  echo "performance.sh: failed to run: ${failed[*]}" >&2
  exit 1
fi
