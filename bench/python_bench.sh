#!/usr/bin/env bash
# bench/python_bench.sh — `bazel run //bench:python_bench` body: runs
# bench/python_bench.py with Debian's /usr/bin/python3 (the interpreter the
# extension is built for) and the package built by //python:blobpipe.
set -euo pipefail
runfiles=${RUNFILES_DIR:-$0.runfiles}/blobpipe
export PYTHONPATH=$runfiles/python${PYTHONPATH:+:$PYTHONPATH}
exec /usr/bin/python3 "$runfiles/bench/python_bench.py" "$@"
