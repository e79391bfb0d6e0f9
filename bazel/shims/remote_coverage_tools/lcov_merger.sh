#!/usr/bin/env bash
# Bazel's LCOV_MERGER, called as
#   lcov_merger.sh --coverage_dir=DIR --output_file=FILE [--filter_sources=RX...] ...
# Writes every gcov JSON report under DIR (*.gcov.json.gz) to FILE, one
# document per line; the other flags are for Bazel's own merger and unused.
set -euo pipefail
dir= out=
for arg in "$@"; do
  case $arg in
    --coverage_dir=*) dir=${arg#*=} ;;
    --output_file=*) out=${arg#*=} ;;
  esac
done
[[ -n $dir && -n $out ]] || { echo "lcov_merger: need --coverage_dir and --output_file" >&2; exit 2; }
: >"$out"
find "$dir" -name '*.gcov.json.gz' -print0 | sort -z | while IFS= read -r -d '' f; do
  gzip -dc "$f" >>"$out"
  echo >>"$out"
done
