"""bench/performance_tables.py — the tables of docs/performance.md "Entry
sizes over TCP", one per entry size, from what bench/performance.sh ran.

    /usr/bin/python3 bench/performance_tables.py --csv OUT/entry_sizes_1.csv \
        [--csv OUT/entry_sizes_2.csv ...] [--text RAW.txt ...] [--python-stream OUT/python_stream.txt]

Inputs:

- `--csv`: a CSV that `bench/entry_sizes --csv` wrote (one per repeat of
  the whole run). A cell's figure is the best over every CSV; its spread is
  the slowest run's seconds over the fastest's, over every run of every
  CSV (each CSV cell already holds the best and worst of its own runs).
- `--text`: the text `bench/entry_sizes` prints (the raw files of
  docs/perf/); it gives the best only, so the spread is "–".
- `--python-stream`: the output of `bench/python_stream.py` (or
  `python_bench.py --only stream`); adds the blobpipe-from-Python and
  pyzmq rows at the sizes it measures (64 B, RL sample, 16 MiB). Its
  RL sample is a different sample from entry_sizes' (int64, float32 and
  bool of 2,048, a scalar and a pickled dict); its rate is printed per
  sample.

Output: for each entry size, `### <size>` and a markdown table with the
rows blobpipe over TCP, in-process, ZeroMQ defaults, ZeroMQ tuned, raw
socket (and the raw socket's landing or copying column where measured),
then the Python rows; the columns entries/s, GB/s (entry bytes, 10^9),
spread (worst/best time) and blobpipe / best ZeroMQ (for the Python rows:
blobpipe Python / pyzmq). blobpipe's rows are its largest blobs (1,000
entries, or all of a workload's when fewer).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass

# The workloads in the page's order, with their entry bytes ("" for the
# RL sample, a mix).
ENTRY_BYTES = {"64 B": 64, "1 KiB": 1 << 10, "16 KiB": 16 << 10, "256 KiB": 256 << 10,
               "1 MiB": 1 << 20, "16 MiB": 16 << 20, "RL sample": ""}
SIZES = list(ENTRY_BYTES)

# entry_sizes' column names, in the table's order, and the row each makes.
ROWS = [
    ("blobpipe tcp", "blobpipe over TCP"),
    ("blobpipe in-process", "blobpipe in-process"),
    ("zeromq defaults", "ZeroMQ defaults"),
    ("zeromq tuned", "ZeroMQ tuned"),
    ("raw socket", "raw socket"),
    ("raw socket landing", "raw socket landing"),
    ("raw socket copying", "raw socket copying"),
]
BLOBPIPE = {"blobpipe tcp", "blobpipe in-process"}
ZEROMQ = {"zeromq defaults", "zeromq tuned"}


@dataclass
class Cell:
    entries_per_s: float
    gb_per_s: float | None


def keep_best(cells: dict, key, cell: Cell) -> None:
    """Keeps under `key` the cell with the most entries/s."""
    old = cells.get(key)
    if old is None or cell.entries_per_s > old.entries_per_s:
        cells[key] = cell


def spread(times: dict, key) -> float | None:
    """The slowest run's seconds over the fastest's, over every run seen
    (None when no run time was read: printed output has none)."""
    if key not in times:
        return None
    lo, hi = times[key]
    return hi / lo


class InputError(Exception):
    """An input file that is not what bench/entry_sizes or
    bench/python_stream.py writes: the message names the file and line."""


def read_csv(path: str, cells: dict, times: dict) -> None:
    """Reads an `entry_sizes --csv` file into `cells` (best cell per
    (workload, column, blob)) and `times` (fastest and slowest seconds).
    Raises InputError for a row without those fields or with a figure that
    is not a positive number."""
    with open(path, newline="") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            try:
                key = (r["workload"], r["column"].strip(), int(r["blob_entries"] or 0))
                best, worst = float(r["seconds_best"]), float(r["seconds_worst"])
                cell = Cell(float(r["entries_per_s"]), float(r["gb_per_s"]))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise InputError(f"{path}:{line}: not an entry_sizes --csv row ({e!r})") from None
            if not 0 < best <= worst:
                raise InputError(f"{path}:{line}: seconds_best {best} and seconds_worst {worst} "
                                 "are not 0 < best <= worst")
            keep_best(cells, key, cell)
            lo, hi = times.get(key, (best, worst))
            times[key] = (min(lo, best), max(hi, worst))


WORKLOAD = re.compile(r"^\[(?P<w>[^\]]+)\] \d+ entries")
RATE = re.compile(r"^\s+(?P<col>\S.*?)\s{2,}(?:blob (?P<blob>\d+))?\s*(?P<eps>\d+) /s\s+(?P<gbs>[\d.]+) GB/s")


def read_text(path: str, cells: dict) -> None:
    workload = None
    with open(path) as f:
        for line in f:
            m = WORKLOAD.match(line)
            if m:
                workload = m["w"]
                continue
            m = RATE.match(line)
            if m and workload:
                keep_best(cells, (workload, m["col"].strip(), int(m["blob"] or 0)),
                          Cell(float(m["eps"]), float(m["gbs"])))


# python_stream.py's lines: "    64 B      Python emit_many +value   475,210.14 entries/s spread 1.35 ..."
PY_LINE = re.compile(r"^\s+(?P<w>64 B|RL sample|16 MiB)\s+(?P<what>\S.*?)\s{2,}(?P<rate>[\d,.]+) "
                     r"(?P<unit>entries/s|samples/s|GB/s)\s+spread (?P<spread>[\d.]+)")
# The pairs python_stream.py prints a ratio for: (blobpipe Python row, pyzmq row).
PY_PAIRS = {
    "64 B": [("Python emit +value", "pyzmq send"),
             ("Python emit_many +value", "pyzmq send_multipart x1000")],
    "RL sample": [("Python send_blob +value", "pyzmq send_multipart"),
                  ("Python emit +value", "pyzmq send_multipart")],
    "16 MiB": [("Python emit copy=False +value", "pyzmq copy=False"),
               ("Python emit +value", "pyzmq copy=True")],
}


def read_python_stream(path: str, out: dict) -> None:
    """Adds to `out`, {workload: {row: (rate, unit, spread)}}, the best
    rate of each row over every file read, with the largest spread seen
    by the time that rate was."""
    with open(path) as f:
        for line in f:
            m = PY_LINE.match(line)
            if not m:
                continue
            rate = float(m["rate"].replace(",", ""))
            rows = out.setdefault(m["w"], {})
            old = rows.get(m["what"])
            spread = float(m["spread"])
            if old is None or rate > old[0]:
                rows[m["what"]] = (rate, m["unit"], max(spread, old[2]) if old else spread)


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def fmt_gb(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def fmt_ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}×"


def fmt_spread(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def table(workload: str, cells: dict, times: dict, py: dict) -> list[str]:
    # Per column, its largest blob's key (blobpipe's columns; the others have no blob).
    by_col: dict = {}
    for key in cells:
        if key[0] == workload and (key[1] not in by_col or key[2] > by_col[key[1]][2]):
            by_col[key[1]] = key
    if not by_col and workload not in py:
        return []
    zmq = [cells[by_col[c]].entries_per_s for c in ZEROMQ if c in by_col]
    best_zmq = max(zmq) if zmq else None
    lines = [f"### {workload}", "",
             "| | entries/s | GB/s | spread | blobpipe / best ZeroMQ |",
             "|---|---:|---:|---:|---:|"]
    for col, name in ROWS:
        if col not in by_col:
            continue
        key = by_col[col]
        c, blob = cells[key], key[2]
        label = f"{name} (blobs of {blob:,})" if col in BLOBPIPE and blob else name
        ratio = c.entries_per_s / best_zmq if col in BLOBPIPE and best_zmq else None
        lines.append(f"| {label} | {fmt_rate(c.entries_per_s)} | {fmt_gb(c.gb_per_s)} | "
                     f"{fmt_spread(spread(times, key))} | {fmt_ratio(ratio)} |")
    rows = py.get(workload, {})
    printed: set = set()
    for ours, theirs in PY_PAIRS.get(workload, []):
        for what in (ours, theirs):
            if what not in rows or what in printed:  # a pyzmq row shared by two pairs: once
                continue
            printed.add(what)
            rate, unit, row_spread = rows[what]
            eps, gbs = rate, None
            if unit == "GB/s":  # 16 MiB: entries of 2^24 bytes
                eps, gbs = rate * 1e9 / (16 << 20), rate
            name = ("blobpipe " if what.startswith("Python") else "") + what
            if unit == "samples/s":
                name += ", samples/s"
            ratio = None
            if what == ours and theirs in rows:
                ratio = rate / rows[theirs][0]
            lines.append(f"| {name} | {fmt_rate(eps)} | {fmt_gb(gbs)} | {fmt_spread(row_spread)} | "
                         f"{fmt_ratio(ratio)} |")
    return lines + [""]


def write_merged(path: str, cells: dict, times: dict) -> None:
    """The best cell of each (workload, column, blob), as entry_sizes --csv
    writes it (entry_bytes and entries left empty: the plot reads the
    workload's entry bytes, column, blob and GB/s)."""
    def order(key):
        return (SIZES.index(key[0]) if key[0] in SIZES else len(SIZES), key[1], key[2])

    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["workload", "entry_bytes", "entries", "column", "blob_entries", "seconds_best",
                    "seconds_worst", "entries_per_s", "gb_per_s"])
        for key in sorted(cells, key=order):
            workload, col, blob = key
            c = cells[key]
            lo, hi = times.get(key, ("", ""))
            w.writerow([workload, ENTRY_BYTES.get(workload, ""), "", col, blob, lo, hi,
                        f"{c.entries_per_s:.0f}", f"{c.gb_per_s:.4f}" if c.gb_per_s is not None else ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", action="append", default=[], help="entry_sizes --csv output (repeatable)")
    ap.add_argument("--text", action="append", default=[], help="entry_sizes' printed output (repeatable)")
    ap.add_argument("--python-stream", action="append", default=[], help="python_stream.py output")
    ap.add_argument("--only", action="append", default=[], help="only this workload (repeatable)")
    ap.add_argument("--merged-csv", help="also write the best cells, in entry_sizes' CSV form (for the plot)")
    a = ap.parse_args(argv)
    cells: dict = {}
    times: dict = {}
    py: dict = {}
    try:
        for p in a.csv:
            read_csv(p, cells, times)
    except InputError as e:
        print(f"performance_tables.py: {e}", file=sys.stderr)
        return 2
    for p in a.text:
        read_text(p, cells)
    for p in a.python_stream:
        read_python_stream(p, py)
    if a.merged_csv:
        write_merged(a.merged_csv, cells, times)
    out = []
    for w in SIZES:
        if a.only and w not in a.only:
            continue
        out += table(w, cells, times, py)
    sys.stdout.write("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
