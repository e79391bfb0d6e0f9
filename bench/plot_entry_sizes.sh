#!/usr/bin/env bash
# bench/plot_entry_sizes.sh — docs/performance.md "Plot" from a CSV that
# bench/entry_sizes wrote (--csv): GB/s of entry bytes by entry size, one
# curve per column (blobpipe's blobs of 1,000 entries, or fewer where the
# workload has fewer), log-log. The RL sample is not a size and is left out.
#
#   bench/plot_entry_sizes.sh docs/perf/entry_sizes.csv docs/perf/entry_sizes.svg   (bench/performance.sh runs it)
#
# Needs gnuplot (Debian: apt-get install --no-install-recommends gnuplot-nox);
# it is only for the docs, so bazel/bazelw does not install it.
set -euo pipefail
csv=${1:?usage: plot_entry_sizes.sh ENTRY_SIZES.CSV OUT.SVG}
out=${2:?usage: plot_entry_sizes.sh ENTRY_SIZES.CSV OUT.SVG}
command -v gnuplot >/dev/null || { echo "plot_entry_sizes.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One data file per column: entry_bytes gb_per_s. For blobpipe the largest
# blob of each workload (1,000 entries, or all of them).
awk -F, -v dir="$work" '
  NR == 1 || $1 == "RL sample" { next }
  {
    col = $4; gsub(/ /, "_", col)
    if (col ~ /^blobpipe/) { key = col SUBSEP $2; if ($5 + 0 <= best[key] + 0) next; best[key] = $5 }
    val[col, $2] = $9; sizes[$2] = 1; cols[col] = 1
  }
  END {
    for (c in cols) for (s in sizes) if ((c, s) in val) print s, val[c, s] > (dir "/" c ".dat")
  }' "$csv"
for f in "$work"/*.dat; do sort -n -o "$f" "$f"; done
plots=()
# The usual columns first, in this order; then any other column (a CSV
# that joins two builds' runs may name them "blobpipe tcp before" ...).
for c in blobpipe_tcp blobpipe_in-process zeromq_defaults zeromq_tuned raw_socket; do
  [[ -f $work/$c.dat ]] && plots+=("'$work/$c.dat' using 1:2 with linespoints lw 2 title '${c//_/ }'")
done
for f in "$work"/*.dat; do
  c=$(basename "$f" .dat)
  case " blobpipe_tcp blobpipe_in-process zeromq_defaults zeromq_tuned raw_socket " in
    *" $c "*) ;;
    *) plots+=("'$f' using 1:2 with linespoints lw 2 title '${c//_/ }'") ;;
  esac
done
(IFS=,; gnuplot <<GP
set terminal svg size 760,460 dynamic font 'sans,12'
set output '$out'
set title 'Entry bytes delivered per second, TCP loopback, 2-core VM'
set logscale xy
set xlabel 'entry size (bytes)'
set ylabel 'GB/s of entry bytes'
set xtics ('64 B' 64, '1 KiB' 1024, '16 KiB' 16384, '256 KiB' 262144, '1 MiB' 1048576, '16 MiB' 16777216)
set key left top
set grid
plot ${plots[*]}
GP
)
echo "wrote $out"
