#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] — builds the libFuzzer targets with clang (in an
# output base of their own, so the gcc build's cache is left alone) and runs
# each for SECONDS (default 60), seeded from ../shared/golden. A crash
# leaves its input in fuzz/artifacts/ and fails the script; turn each into a
# regression case in test/format_test.cpp.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
seconds=${1:-60}
golden=${BLOBPIPE_GOLDEN_DIR:-$root/../shared/golden}
out_base=${BLOBPIPE_FUZZ_OUTPUT_BASE:-$HOME/.cache/blobpipe-bazel-fuzz}

bazel/bazelw --output_base="$out_base" build --config=fuzz //fuzz:all >/dev/null 2>&1 ||
  bazel/bazelw --output_base="$out_base" build --config=fuzz //fuzz:all
bin=$(bazel --output_base="$out_base" info --config=fuzz bazel-bin 2>/dev/null)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p fuzz/artifacts

seed() {  # seed corpora: whole blobs, index bytes, dtype strings, meta maps
  local dir=$work/$1
  mkdir -p "$dir"
  case $1 in
    read_index_fuzz) cp "$golden"/*.blob "$dir"/ ;;
    dtype_fuzz)
      for s in float32 bfloat16 half float8_e4m3fn '<f4' '>i8' '|b1' '<U3' '|S4' '<M8[ns]' '<m8[s]' '|V8'; do
        printf '%s' "$s" >"$dir/$(printf '%s' "$s" | md5sum | cut -c1-8)"
      done ;;
    entry_meta_fuzz)
      python3 - "$golden/manifest.json" "$dir" <<'PY'
import json, sys, pathlib
m = json.load(open(sys.argv[1]))
out = pathlib.Path(sys.argv[2])
n = 0
def rows(c):
    yield from c.get("entries", [])
    yield from c.get("entries_head", [])
    for b in c.get("blobs", []):
        yield from b["entries"]
for c in m["cases"]:
    for e in rows(c):
        (out / f"meta{n}").write_bytes(bytes.fromhex(e["meta_msgpack_hex"]))
        n += 1
PY
      ;;
  esac
  echo "$dir"
}

status=0
for t in read_index_fuzz dtype_fuzz entry_meta_fuzz; do
  corpus=$(seed "$t")
  echo "== $t (${seconds}s)"
  if ! "$bin/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="fuzz/artifacts/$t-" -print_final_stats=1 "$corpus" 2>"$work/$t.log"; then
    tail -40 "$work/$t.log"
    status=1
  else
    grep -E 'stat::number_of_executed_units|Done' "$work/$t.log" | tail -2
  fi
done
exit $status
