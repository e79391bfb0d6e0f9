#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] — builds the libFuzzer targets with clang (in an
# output base of their own, so the gcc build's cache is left alone) and runs
# each for SECONDS (default 60), starting from its corpus kept in the
# repository (fuzz/corpus/<target>/) plus seeds made from ../shared/golden.
#
# A target FAILS when its fuzzer finds a crash, a sanitizer report
# (undefined behaviour included: the build has -fno-sanitize-recover=all and
# UBSAN_OPTIONS halts on the first error), an input over its memory budget
# (fuzz/alloc_budget.hpp), or a timeout; and when its seeds cannot be made.
# The failing input is left in fuzz/artifacts/; turn each into a regression
# case (format parsers: test/format_test.cpp; frame codec: test/wire_test.cpp;
# consumer streams: test/consumer_test.cpp).
#
#   FUZZ_TARGETS="wire_fuzz consumer_fuzz" fuzz/run.sh 30   # a subset
#   BLOBPIPE_FUZZ_MERGE=1 fuzz/run.sh 3600                  # grow the corpus
#
# BLOBPIPE_FUZZ_MERGE=1 writes what the run found back into
# fuzz/corpus/<target>/, minimised (libFuzzer -merge=1 of the old corpus
# and the new finds into an empty folder: the smallest set of inputs with
# the same coverage), leaving out inputs over 64 KiB (the seeds, made
# afresh each run, bring the big ones); commit the result. Without it the
# corpus is only read, and new finds stay in a temporary folder.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
seconds=${1:-60}
golden=${BLOBPIPE_GOLDEN_DIR:-$root/../shared/golden}
out_base=${BLOBPIPE_FUZZ_OUTPUT_BASE:-$HOME/.cache/blobpipe-bazel-fuzz}
merge=${BLOBPIPE_FUZZ_MERGE:-0}

# --symlink_prefix=/: no bazel-* links, so the gcc build's links stay put.
build=(bazel/bazelw --output_base="$out_base" build --config=fuzz --symlink_prefix=/ //fuzz:all)
"${build[@]}" >/dev/null 2>&1 || "${build[@]}"
bin=$(bazel --output_base="$out_base" info --config=fuzz bazel-bin 2>/dev/null)

# Stop at the first undefined behaviour, with its stack (the build makes
# every UBSan check fatal too; this also covers checks compiled elsewhere).
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p fuzz/artifacts

# seed TARGET DIR: seed inputs (whole blobs, index bytes, dtype strings,
# meta maps, wire streams) into DIR. Every step says when it fails (this
# runs inside `if`, where set -e does not apply), and no seeds is a failure.
seed() {
  local t=$1 dir=$2
  mkdir -p "$dir" || return 1
  case $t in
    read_index_fuzz) cp "$golden"/*.blob "$dir"/ || return 1 ;;
    dtype_fuzz)
      local s
      for s in float32 bfloat16 half float8_e4m3fn '<f4' '>i8' '|b1' '<U3' '|S4' '<M8[ns]' '<m8[s]' '|V8'; do
        printf '%s' "$s" >"$dir/$(printf '%s' "$s" | md5sum | cut -c1-8)" || return 1
      done ;;
    wire_fuzz)  # frame headers, v3 hellos, entry_begin payloads
      python3 - "$golden/manifest.json" "$dir" <<'PY' || return 1
import json, struct, sys, pathlib
out = pathlib.Path(sys.argv[2])
for t in range(1, 9):
    out.joinpath(f"hdr{t}").write_bytes(struct.pack("<BBHIQQ", t, 0, 0, 64, 1, 0) + struct.pack("<I", 1 << 20))
for role, window, dedup in ((1, 0, 0), (2, 1 << 26, 4096)):
    hello = (struct.pack("<IHHIIQII", 0x50575042, 3, role, 1 << 20, 1 << 16, window, 4096, dedup)
             + bytes(range(16)) + struct.pack("<QIHH", 0, 65536, 0, 0))
    out.joinpath(f"hello{role}").write_bytes(hello)
m = json.load(open(sys.argv[1]))
n = 0
for c in m["cases"]:
    for e in c.get("entries", [])[:4]:
        meta = bytes.fromhex(e["meta_msgpack_hex"])
        out.joinpath(f"eb{n}").write_bytes(struct.pack("<II", 3, len(meta)) + b"key" + meta)
        n += 1
PY
      ;;
    consumer_fuzz|decoder_fuzz) "$bin/fuzz/seed_streams" "$golden" "$dir" >/dev/null || return 1 ;;
    entry_meta_fuzz)
      python3 - "$golden/manifest.json" "$dir" <<'PY' || return 1
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
    *) echo "no seeds for $t" >&2; return 1 ;;
  esac
  [[ -n $(ls -A "$dir") ]] || { echo "no seeds in $dir" >&2; return 1; }
}

status=0
for t in ${FUZZ_TARGETS:-read_index_fuzz dtype_fuzz entry_meta_fuzz wire_fuzz decoder_fuzz consumer_fuzz}; do
  echo "== $t (${seconds}s)"
  seeds=$work/seeds/$t finds=$work/finds/$t corpus=$root/fuzz/corpus/$t
  if ! seed "$t" "$seeds" 2>"$work/$t.log"; then
    cat "$work/$t.log"
    echo "fuzz: $t FAILED (seeding)"
    status=1
    continue
  fi
  mkdir -p "$finds" "$corpus"
  extra=()
  # Streams of the large golden blobs are megabytes; shorter inputs run
  # ten times as many executions (a cut stream is a test case too).
  [[ $t == consumer_fuzz || $t == decoder_fuzz ]] && extra=(-max_len=131072)
  # New finds go to the first folder ($finds); the kept corpus and the
  # seeds are read only.
  if ! "$bin/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 "${extra[@]}" \
      -artifact_prefix="fuzz/artifacts/$t-" -print_final_stats=1 \
      "$finds" "$corpus" "$seeds" 2>"$work/$t.log"; then
    tail -40 "$work/$t.log"
    echo "fuzz: $t FAILED"
    status=1
    continue
  fi
  grep -E 'stat::number_of_executed_units|Done' "$work/$t.log" | tail -2
  if [[ $merge == 1 ]]; then
    mkdir -p "$work/merged/$t"
    if ! "$bin/fuzz/$t" -merge=1 "${extra[@]}" "$work/merged/$t" "$corpus" "$finds" \
        2>"$work/$t.merge.log"; then
      tail -20 "$work/$t.merge.log"
      echo "fuzz: $t FAILED (merge)"
      status=1
      continue
    fi
    find "$work/merged/$t" -type f -size +64k -delete
    rm -rf "$corpus"
    cp -r "$work/merged/$t" "$corpus"
    echo "corpus: $(ls "$corpus" | wc -l) inputs in fuzz/corpus/$t"
  fi
  echo "fuzz: $t PASSED"
done
exit $status
