#!/usr/bin/env bash
# test/install_test.sh INSTALL — installs blobpipe with //:install into a
# scratch PREFIX, then compiles, links and runs a small program against the
# installed tree twice: with pkg-config (blobpipe.pc) and with CMake
# (find_package(blobpipe), blobpipe::blobpipe). The program uses the codec,
# the pickle writer and URL parsing (symbols from several of the merged
# libraries) and exits 0 only when they work. Without g++, pkg-config or
# cmake the part that needs it prints `SKIPPED: <target> <part>: <reason>`.
set -uo pipefail

install=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # a path, not a name PATH resolves
target=${TEST_TARGET:-install_test.sh}
work=${TEST_TMPDIR:-$(mktemp -d)}/install_test
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
failures=0
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }

command -v g++ >/dev/null || { echo "SKIPPED: $target (every part): g++ is not installed"; exit 0; }
"$install" "$prefix" || { echo "FAILED: //:install $prefix"; exit 1; }
for f in include/blobpipe/format.hpp include/blobpipe/cluster/server.hpp lib/libblobpipe.a \
         lib/pkgconfig/blobpipe.pc lib/cmake/blobpipe/blobpipeConfig.cmake; do
  [[ -f $prefix/$f ]] || fail "$f not installed"
done

mkdir -p "$work/app"
cat >"$work/app/main.cpp" <<'CPP'
#include <cstdio>
#include <vector>

#include "blobpipe/format.hpp"
#include "blobpipe/transport/url.hpp"

int main() {
  std::vector<float> x = {0, 1, 2, 3, 4, 5};
  auto meta = blobpipe::pickle(blobpipe::pickle_value::dict{{"idx", 7}}).value();
  auto p = blobpipe::plan({"x", "meta"}, {blobpipe::value::tensor(x, {2, 3}),
                                          blobpipe::value::pickle(meta)});
  std::vector<std::byte> blob(p->nbytes);
  blobpipe::write(*p, blob).value();
  auto idx = blobpipe::read_index(blob);
  auto v = blobpipe::decode_entry(blob, idx->entries[0]);
  auto u = blobpipe::parse_url("tcp://127.0.0.1:5555");
  const bool ok = v->at<float>(5) == 5.0f && idx->entries.size() == 2 && u && u->port == 5555;
  std::printf("%s\n", ok ? "blobpipe works" : "blobpipe is broken");
  return ok ? 0 : 1;
}
CPP

# pkg-config
if command -v pkg-config >/dev/null; then
  if flags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs blobpipe); then
    # shellcheck disable=SC2086  # flags are words
    if g++ -o "$work/app/by_pkgconfig" "$work/app/main.cpp" $flags; then
      "$work/app/by_pkgconfig" | grep -qx "blobpipe works" || fail "pkg-config build does not run"
    else
      fail "g++ with pkg-config's flags ($flags)"
    fi
  else
    fail "pkg-config --cflags --libs blobpipe"
  fi
else
  echo "SKIPPED: $target pkg-config: pkg-config is not installed (Debian: pkg-config)"
fi

# CMake
if command -v cmake >/dev/null; then
  cat >"$work/app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(blobpipe_user LANGUAGES CXX)
find_package(blobpipe 0.1 REQUIRED)
add_executable(by_cmake main.cpp)
target_link_libraries(by_cmake PRIVATE blobpipe::blobpipe)
CMAKE
  if cmake -S "$work/app" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log" 2>&1 &&
     cmake --build "$work/build" >>"$work/cmake.log" 2>&1; then
    "$work/build/by_cmake" | grep -qx "blobpipe works" || fail "CMake build does not run"
  else
    cat "$work/cmake.log"
    fail "cmake configure or build against $prefix"
  fi
else
  echo "SKIPPED: $target cmake: cmake is not installed (Debian: cmake; bazel/bazelw installs it)"
fi

echo "install_test: $failures failed"
[[ $failures -eq 0 ]]
