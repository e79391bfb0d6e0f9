#!/usr/bin/env bash
# bazel/bazelw reads the facts that decide which test cases run or skip
# (BLOBPIPE_ENV_DIGEST, in every test's environment) with the PATH the
# tests get, .bazelrc's --action_env, not the caller's: clones run from
# shells whose PATHs differ then share cached results (README "Building
# and testing"). A stand-in `bazel` prints the digest bazelw hands it, from
# a shell with one more tool on its PATH (a `tc`) and from one without.
#   bazelw_env_test.sh PATH_TO_BAZELW PATH_TO_BAZELRC
set -euo pipefail
fail() { echo "bazelw_env_test: $*" >&2; exit 1; }
work=${TEST_TMPDIR:-$(mktemp -d)}/bazelw
rm -rf "$work"
mkdir -p "$work/repo/bazel" "$work/stub" "$work/extra"
cp "$1" "$work/repo/bazel/bazelw"
cp "$2" "$work/repo/.bazelrc"
touch "$work/repo/WORKSPACE"
printf '#!/bin/sh\necho "$BLOBPIPE_ENV_DIGEST"\n' >"$work/stub/bazel"
printf '#!/bin/sh\nexit 0\n' >"$work/extra/tc"
chmod +x "$work/repo/bazel/bazelw" "$work/stub/bazel" "$work/extra/tc"
grep -q '^build --action_env=PATH=' "$work/repo/.bazelrc" || fail ".bazelrc gives actions no PATH"
without=$(cd "$work/repo" && PATH="$work/stub:/usr/bin:/bin" bazel/bazelw)
with=$(cd "$work/repo" && PATH="$work/stub:$work/extra:/usr/bin:/bin" bazel/bazelw)
[[ -n $without ]] || fail "bazelw handed bazel no BLOBPIPE_ENV_DIGEST"
[[ $without == "$with" ]] || fail "the digest follows the caller's PATH: $without without a tc on it, $with with one"
echo "bazelw_env_test: ok ($without)"
