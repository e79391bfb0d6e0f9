#!/usr/bin/env bash
# test/version_test.sh — one version: every copy agrees with //:version.bzl
# (the CLI's --version, the Python package's __version__, the wheel's name,
# blobpipe.pc and blobpipeConfigVersion.cmake).
#
#   version_test.sh VERSION_BZL CLI PYTHON_INIT WHEEL PC CMAKE_VERSION
set -euo pipefail
bzl=$1 cli=$2 init=$3 wheel=$4 pc=$5 cmake=$6
fail=0
check() {  # what got want
  if [[ "$2" == "$3" ]]; then echo "ok: $1 = $2"; else echo "FAIL: $1 is '$2', version.bzl says '$3'"; fail=1; fi
}

want=$(sed -n 's/^BLOBPIPE_VERSION = "\(.*\)"$/\1/p' "$bzl")
[[ "$want" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "FAIL: version.bzl gives '$want', not MAJOR.MINOR.PATCH"; exit 1; }

check "blobpipe --version" "$("$cli" --version)" "blobpipe $want"
check "blobpipe.__version__" \
  "$(PYTHONPATH="$(dirname "$(dirname "$init")")" /usr/bin/python3 -c 'import blobpipe; print(blobpipe.__version__)')" "$want"
wheel_version=$(basename "$wheel" | cut -d- -f2)
check "the wheel's name" "$wheel_version" "$want"
check "the wheel's METADATA" \
  "$(/usr/bin/python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); print(next(l for n in z.namelist() if n.endswith("METADATA") for l in z.read(n).decode().splitlines() if l.startswith("Version: "))[9:])' "$wheel")" "$want"
check "blobpipe.pc" "$(sed -n 's/^Version: //p' "$pc")" "$want"
check "blobpipeConfigVersion.cmake" "$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$cmake")" "$want"
exit $fail
