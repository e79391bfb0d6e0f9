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
# Nothing written beside the sources: no __pycache__, no .pytest_cache.
export PYTHONDONTWRITEBYTECODE=1
cd "$root"
exec /usr/bin/python3 -m pytest -p no:cacheprovider -q -rs "$@"
