#!/usr/bin/env bash
# The GPU check (docs/cuda.md): builds the CUDA tests and the streaming
# benchmark with CMake (the GPU machine has nvcc and CMake, no Bazel, no
# network), runs the tests on one GPU, then the benchmark (device-to-host,
# host-to-device, device-to-device through loopback, next to cudaMemcpy of
# the same bytes). About 2-3 minutes on a 16-core machine. Time limits:
# every step has its own (20 s to 420 s), cut to what is left of a budget
# for the whole run (--budget, default 540 s), so the script ends within
# the budget plus 10 s (a step's kill grace); a step cut off fails.
#
#   bash tools/gpu_prepare.sh          # on the dev machine: .gpu_deps
#   bash tools/gpu_check.sh            # on the GPU machine
#   bash tools/gpu_check.sh --dry-run  # anywhere: no device needed
#
# Options:
#   --dry-run        no device required: device cases SKIP, the benchmark
#                    prints SKIP, and the exit status is 0 unless a case
#                    FAILs or the build breaks
#   --build-dir DIR  CMake build folder (default .gpu_build, git-ignored;
#                    kept between runs, so a rerun only rebuilds changes)
#   --jobs N         parallel compile jobs (default: nproc)
#   --quick          smaller benchmark (256 MiB per mode instead of 1 GiB)
#   --budget SECONDS time for the whole run (default 540: under the device
#                    tool's 600 s limit per command)
#   --help           print this text
# Output: one log, also copied to $OUT/gpu_check.log when $OUT is set (the
# device tool's result folder). Exit status: 0 all passed; 1 a test or
# benchmark failed; 2 bad usage or missing tools; 3 no device (not
# --dry-run); 4 the build failed.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/.gpu_build"
jobs="$(nproc 2>/dev/null || echo 4)"
dry_run=0
bench_mib=1024
budget=540
usage="usage: $0 [--dry-run] [--build-dir DIR] [--jobs N] [--quick] [--budget SECONDS]"
# A usage error: one line saying what is wrong, then the usage line.
bad_usage() { printf 'gpu_check: %s\n%s\n' "$1" "$usage" >&2; exit 2; }
while (($#)); do
  case "$1" in
    -h|--help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    --dry-run) dry_run=1 ;;
    --build-dir)
      (($# >= 2)) && [[ -n "$2" ]] || bad_usage "--build-dir needs a directory"
      build="$2"; shift ;;
    --jobs)
      (($# >= 2)) && [[ "$2" =~ ^[1-9][0-9]*$ ]] || bad_usage "--jobs needs a positive number"
      jobs="$2"; shift ;;
    --quick) bench_mib=256 ;;
    --budget)
      (($# >= 2)) && [[ "$2" =~ ^[1-9][0-9]*$ ]] ||
        bad_usage "--budget needs a positive number of seconds"
      budget="$2"; shift ;;
    *) bad_usage "unknown option '$1'" ;;
  esac
  shift
done

log="$build/gpu_check.log"
mkdir -p "$build"
: >"$log"
say() { echo "$*" | tee -a "$log"; }
# Runs a step under its time limit, cut to what is left of the budget,
# its output into the log. Out of time: the step fails (status 124).
deadline=$((SECONDS + budget))
step() {
  local limit="$1" left=$((deadline - SECONDS)); shift
  if ((left <= 0)); then
    say "gpu_check: the ${budget} s budget is spent; not run: $*"
    return 124
  fi
  ((limit > left)) && limit=$left
  say "+ $* (limit ${limit} s)"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
finish() {
  local rc="$1"
  say "gpu_check: exit $rc"
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then cp "$log" "$OUT/gpu_check.log"; fi
  exit "$rc"
}

say "gpu_check: $(date -u +%FT%TZ) on $(uname -n), $jobs jobs, build in $build"
export PATH="$PATH:/usr/local/cuda/bin"
command -v cmake >/dev/null || { say "gpu_check: cmake not found"; finish 2; }
command -v nvcc >/dev/null || { say "gpu_check: nvcc not found (CUDA toolkit)"; finish 2; }
say "$(cmake --version | head -1); $(nvcc --version | tail -1); $(${CXX:-g++} --version | head -1)"
if command -v nvidia-smi >/dev/null; then
  step 20 nvidia-smi --query-gpu=index,name,memory.total,driver_version \
    --format=csv,noheader || true
else
  say "nvidia-smi: not found"
fi

deps="$root/.gpu_deps/include"
if [[ -e "$deps/asio.hpp" ]]; then
  say "headers: $deps"
elif [[ -e /usr/include/asio.hpp && -e /usr/include/msgpack.hpp ]]; then
  say "headers: /usr/include (no .gpu_deps)"
else
  say "gpu_check: no Asio/msgpack headers: run tools/gpu_prepare.sh on the dev machine and carry .gpu_deps"
  finish 2
fi

t0=$SECONDS
step 120 cmake -S "$root/tools/gpu" -B "$build" -DCMAKE_BUILD_TYPE=Release || finish 4
step 420 cmake --build "$build" -j "$jobs" || finish 4
say "build: $((SECONDS - t0)) s"

rc=0
if ((dry_run)); then
  step 120 "$build/gpu_selfcheck" || rc=1
  step 60 "$build/cuda_stream_bench" --mib-per-mode 64 --entry-mib 16 || rc=1
  # The emulator exercises the benchmark's own code paths without a GPU.
  step 120 "$build/cuda_stream_bench" --emulated --mib-per-mode 64 --entry-mib 16 || rc=1
  finish "$rc"
fi

step 150 "$build/gpu_selfcheck" --require-device
case $? in
  0) ;;
  *) rc=1 ;;
esac
if ! grep -q '^device 0:' "$log"; then
  say "gpu_check: no CUDA device visible (see the self-check's 'device:' line)"
  finish 3
fi
step 120 "$build/cuda_stream_bench" --require-device --mib-per-mode "$bench_mib" --entry-mib 64 || rc=1
step 90 "$build/cuda_stream_bench" --require-device --mib-per-mode 256 --entry-mib 64 --link tcp || rc=1
say "total: $((SECONDS - t0)) s"
finish "$rc"
