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
# install_test (tag no_coverage) links the installed archive with plain
# g++ and CMake, which lack gcov's runtime: it runs in the test phase.
filters=(--test_tag_filters=-no_coverage)

# What the coverage is of, for tools/mutate/mutate.py --coverage (a
# mutant's file changed since is run against its dependent tests instead):
# the commit and the files that differed from it.
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=all 2>/dev/null | cut -c4- |
          sed 's/.* -> //' | /usr/bin/python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().split()))')
bazel/bazelw coverage "${flags[@]}" "${filters[@]}" --keep_going "${targets[@]}" 2>&1 | tee /dev/stderr |
  grep -oE '^//[^ ]+ +(\(cached\) )?PASSED' | awk '{print $1}' >"${TMPDIR:-/tmp}/coverage-targets.$$"
rc=${PIPESTATUS[0]}
testlogs=$(bazel/bazelw info "${flags[@]}" --platform_suffix=gcov bazel-testlogs 2>/dev/null)
# ... and the tests that passed this run (a coverage.dat of another is
# an earlier run's).
passed=$(/usr/bin/python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().split()))' \
           <"${TMPDIR:-/tmp}/coverage-targets.$$")
[[ -d $testlogs ]] && printf '{"commit": "%s", "dirty": %s, "tests": %s}\n' \
  "$commit" "$dirty" "$passed" >"$testlogs/coverage-source.json"
echo
echo "coverage of lib/ and python/ext from: ${targets[*]}"
/usr/bin/python3 tools/coverage_report.py "$testlogs" <"${TMPDIR:-/tmp}/coverage-targets.$$" || rc=2
rm -f "${TMPDIR:-/tmp}/coverage-targets.$$"
exit "$rc"
