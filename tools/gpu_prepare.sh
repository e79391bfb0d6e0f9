#!/usr/bin/env bash
# Run on the dev machine before a GPU check: copies the header-only
# dependencies the GPU machine lacks (standalone Asio, msgpack-cxx) from
# /usr/include into .gpu_deps/include (git-ignored). The device tool
# carries that folder with the tree when asked (carry [".gpu_deps"]; at
# most 64 MiB in all), and tools/gpu/CMakeLists.txt uses it.
#   bash tools/gpu_prepare.sh
# Takes no arguments. Exit status: 0 done; 1 a header is missing or the
# copy is too big; 2 bad usage.
set -euo pipefail
usage="usage: $0 (no arguments; --help prints this)"
if (($#)); then
  if [[ $1 == -h || $1 == --help ]]; then echo "$usage"; exit 0; fi
  printf 'gpu_prepare: unexpected argument %s\n%s\n' "'$1'" "$usage" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.gpu_deps/include"
rm -rf "$root/.gpu_deps"
mkdir -p "$dest"
for h in asio.hpp asio msgpack.hpp msgpack; do
  if [[ ! -e "/usr/include/$h" ]]; then
    echo "gpu_prepare: /usr/include/$h is missing (apt-get install libasio-dev libmsgpack-cxx-dev)" >&2
    exit 1
  fi
  cp -a "/usr/include/$h" "$dest/"
done
kib=$(du -sk "$root/.gpu_deps" | cut -f1)
echo "gpu_prepare: $dest ($((kib / 1024)) MiB)"
if (( kib > 48 * 1024 )); then
  echo "gpu_prepare: more than 48 MiB; the device tool carries at most 64 MiB in all" >&2
  exit 1
fi
