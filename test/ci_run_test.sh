#!/usr/bin/env bash
# .ci/run's counts (docs/reliability.md "Skips"), on a made-up phase: a
# stand-in bazel/bazelw prints three result lines and points `info
# bazel-testlogs` at logs written here. A passed target whose log says ALL
# SKIPPED is not counted as passed; a failed one whose log says so stays
# failed; every SKIPPED line is counted, each target's once.
#   ci_run_test.sh PATH_TO_CI_RUN
set -euo pipefail
ci_run=$1
work=${TEST_TMPDIR:-$(mktemp -d)}/ci
rm -rf "$work"
mkdir -p "$work/repo/.ci" "$work/repo/bazel" "$work/logs/test"/{all_skipped,some_skipped,failed}
cp "$ci_run" "$work/repo/.ci/run"
# Two lines for one target (a log of two runs, say) count it once.
printf 'SKIPPED: //test:all_skipped a: why\nSKIPPED: //test:all_skipped b: why\nALL SKIPPED: //test:all_skipped: 2 of 2 cases\nALL SKIPPED: //test:all_skipped: every part\n' \
  >"$work/logs/test/all_skipped/test.log"
printf 'SKIPPED: //test:some_skipped a: why\n' >"$work/logs/test/some_skipped/test.log"
printf 'ALL SKIPPED: //test:failed: 1 of 1 cases\n' >"$work/logs/test/failed/test.log"
cat >"$work/repo/bazel/bazelw" <<STUB
#!/usr/bin/env bash
if [[ \$1 == info ]]; then echo "$work/logs"; exit 0; fi
echo '//test:all_skipped        (cached) PASSED in 1.0s'
echo '//test:some_skipped       PASSED in 2.0s'
echo '//test:failed             FAILED in 2.0s'
exit 3
STUB
chmod +x "$work/repo/bazel/bazelw"
set +e
out=$(cd "$work/repo" && BLOBPIPE_CI_PHASES=test .ci/run 2>&1)
rc=$?
set -e
echo "$out"
fail() { echo "ci_run_test: $*" >&2; exit 1; }
[[ $rc -ne 0 ]] || fail "a failed target must fail the run"
[[ $(tail -n 1 <<<"$out") == "1 passed, 1 failed, 3 skipped" ]] || fail "wrong counts"
grep -qx '  //test:all_skipped: 2 of 2 cases' <<<"$out" || fail "the all-skipped target is not listed"
echo "ci_run_test: ok"
