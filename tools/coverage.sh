#!/usr/bin/env bash
# tools/coverage.sh [BAZEL TEST TARGETS...] — line and branch coverage of
# lib/ and python/ext from the tests (default: those of the README's test
# command, //...), and the error paths no test reached
# (docs/reliability.md "Coverage").
#
#   tools/coverage.sh                       # the whole suite (long: its own
#                                           # unoptimized build of everything)
#   tools/coverage.sh //test:format_test //test:golden_test   # a subset
#
# Runs `bazel coverage` (.bazelrc: gcc's gcov, -O0, branch counts, outputs
# in an output tree of their own; --symlink_prefix=/ leaves bazel-bin and
# bazel-testlogs at the plain build), then the report
# (tools/coverage_report.py) over the coverage.dat of the tests it ran. A
# test that fails leaves no coverage; the script then exits non-zero.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

targets=("$@")
((${#targets[@]})) || targets=(//...)
flags=(--symlink_prefix=/)

bazel/bazelw coverage "${flags[@]}" --keep_going "${targets[@]}" 2>&1 | tee /dev/stderr |
  grep -oE '^//[^ ]+ +(\(cached\) )?PASSED' | awk '{print $1}' >"${TMPDIR:-/tmp}/coverage-targets.$$"
rc=${PIPESTATUS[0]}
testlogs=$(bazel/bazelw info "${flags[@]}" --platform_suffix=gcov bazel-testlogs 2>/dev/null)
echo
echo "coverage of lib/ and python/ext from: ${targets[*]}"
/usr/bin/python3 tools/coverage_report.py "$testlogs" <"${TMPDIR:-/tmp}/coverage-targets.$$" || rc=2
rm -f "${TMPDIR:-/tmp}/coverage-targets.$$"
exit "$rc"
