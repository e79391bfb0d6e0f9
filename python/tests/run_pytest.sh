#!/usr/bin/env bash
# python/tests/run_pytest.sh TEST_FILE... — a Bazel sh_test's body: runs
# pytest on the given test files (paths relative to the workspace) with
# Debian's /usr/bin/python3, the interpreter the package is built for, and
# the package that //python:blobpipe assembled in the runfiles on
# PYTHONPATH. pytest's exit status is the test's (5, no test collected,
# fails too).
set -euo pipefail
root=${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:?}
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
# Under --config=asan (.ci/run's asan phase) the extension links ASan and
# UBSan and Debian's python3 does not: their runtimes are preloaded, as they
# must come first in the process, and leak checking is off (CPython keeps
# objects alive until exit by design). Any ASan or UBSan report aborts the
# test (abort_on_error, -fno-sanitize-recover), alloc-dealloc mismatches
# included (docs/reliability.md "Sanitizers"). Child processes (the C++
# example, a second python3) inherit all of it.
# (Tests that do not import the package, such as tools/mutate's, have no
# extension in their runfiles: nothing to preload.)
ext=$root/python/blobpipe/_blobpipe.so
runtimes=
if [[ -e $ext ]]; then
  runtimes=$(ldd "$ext" 2>/dev/null | awk '$1 ~ /^lib(asan|ubsan)\.so/ {print $3}' | tr '\n' ' ')
fi
if [[ -n ${runtimes// /} ]]; then
  export LD_PRELOAD="${runtimes% }${LD_PRELOAD:+ $LD_PRELOAD}"
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  echo "run_pytest: sanitizer build, preloading $LD_PRELOAD (ASAN_OPTIONS=$ASAN_OPTIONS)"
fi
# Nothing written beside the sources: no __pycache__, no .pytest_cache.
export PYTHONDONTWRITEBYTECODE=1
cd "$root"
exec /usr/bin/python3 -m pytest -p no:cacheprovider -q -rs "$@"
