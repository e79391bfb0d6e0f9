#!/usr/bin/env bash
# tools/install.sh PREFIX — installs blobpipe for builds outside Bazel:
#
#   bazel/bazelw run //:install -- PREFIX      # e.g. /usr/local or ~/.local
#
#   PREFIX/include/blobpipe/...               the public headers
#   PREFIX/lib/libblobpipe.a                  one static library (//:blobpipe)
#   PREFIX/lib/pkgconfig/blobpipe.pc          pkg-config --cflags --libs blobpipe
#   PREFIX/lib/cmake/blobpipe/blobpipeConfig.cmake (+ ConfigVersion)
#                                             find_package(blobpipe), blobpipe::blobpipe
#
# A relative PREFIX is relative to where you typed the command. Both
# config files find the tree relative to themselves, so it can be moved.
# Users need Debian's libasio-dev, libmsgpack-cxx-dev, libucx-dev,
# libssl-dev and libsodium-dev (headers and link libraries); //test:install_test compiles
# and links a program against an installed tree both ways.
set -euo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  echo "usage: bazel/bazelw run //:install -- PREFIX" >&2
  exit 2
fi
prefix=$1
[[ $prefix == /* ]] || prefix=${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix

# The files this program carries: its runfiles (under `bazel run` the
# working directory; from a test, the directory it lies in).
root=
for d in "${RUNFILES_DIR:-}/blobpipe" "$0.runfiles/blobpipe" "$PWD" "$(dirname "$0")"; do
  if [[ -f $d/libblobpipe.a && -d $d/include/blobpipe ]]; then
    root=$d
    break
  fi
done
[[ -n $root ]] || { echo "install: cannot find libblobpipe.a and include/ beside $0" >&2; exit 1; }

mkdir -p "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/blobpipe"
(cd "$root/include" && find blobpipe -name '*.hpp' -print0 |
   xargs -0 cp --parents --no-preserve=mode -t "$prefix/include")
# cp, not install(1): under Bazel this script is itself named "install",
# and a PATH holding its directory would find it again.
copy() { cp -f --no-preserve=mode "$@"; }
copy "$root/libblobpipe.a" "$prefix/lib/libblobpipe.a"
copy "$root/tools/install/blobpipe.pc" "$prefix/lib/pkgconfig/blobpipe.pc"
copy "$root/tools/install/blobpipeConfig.cmake" "$root/tools/install/blobpipeConfigVersion.cmake" \
  "$prefix/lib/cmake/blobpipe/"
echo "installed blobpipe into $prefix"
