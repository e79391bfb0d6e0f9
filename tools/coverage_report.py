#!/usr/bin/python3
"""tools/coverage_report.py TESTLOGS < TARGETS — the report of
tools/coverage.sh: reads the coverage.dat that `bazel coverage` left for
each test target named on stdin (under TESTLOGS, one gcov JSON document
per line: bazel/shims/remote_coverage_tools), merges the counts of each
source line over every test and every object that compiled it (a header's
lines are counted in each translation unit), and prints line and branch
coverage per folder of lib/ and python/ext, then the error paths no test
reached. Run from the repository root (it reads the sources).

Counted: executable lines (gcov's), and branches that are not exception
edges (gcov's `throw`). A line is covered when any test ran it; a branch
when any test took it. Excluded, and said so: lib/cuda/ (device code: with
no GPU and no --config=cuda only the stubs that answer cuda_failure are
built), and test, fuzz, bench, tools and external code (not what is
measured).

An error path is a line of ours that builds or returns an error
(make_error, errc::, violation(, fail(, throw, .err(); not the `case
errc::x:` lines that name one) that never ran, or
that ran without all of its code running (gcov's unexecuted block: the
`return make_error(...)` of `if (bad) return make_error(...);`).
"""

import collections
import json
import os
import re
import sys

MEASURED = ("lib/", "python/ext/")
EXCLUDED = {"lib/cuda/": "device code: needs a GPU and --config=cuda"}
ERROR_LINE = re.compile(r"make_error|errc::|violation\(|\bfail\(|\bthrow\b|\.err\(\)")


def reports(testlogs, target):
    """The gcov JSON documents of one test target's coverage.dat."""
    pkg, _, name = target.removeprefix("//").partition(":")
    path = os.path.join(testlogs, pkg, name, "coverage.dat")
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        for ln in f:
            if ln.startswith("{"):
                yield json.loads(ln)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n")[0])
    testlogs = sys.argv[1]
    targets = [t.strip() for t in sys.stdin if t.strip()]
    lines = {}      # (file, line) -> [count, unexecuted_block]
    branches = {}   # (file, line) -> [taken flags per branch], OR-ed over objects
    with_data = 0
    for target in targets:
        docs = list(reports(testlogs, target))
        with_data += bool(docs)
        for doc in docs:
            for f in doc["files"]:
                path = os.path.normpath(f["file"])
                if not path.startswith(MEASURED):
                    continue
                for ln in f["lines"]:
                    key = (path, ln["line_number"])
                    cur = lines.setdefault(key, [0, True])
                    cur[0] += ln["count"]
                    # Unexecuted only if no object ran all of the line.
                    cur[1] = cur[1] and ln.get("unexecuted_block", False)
                    taken = [b["count"] > 0 for b in ln["branches"] if not b["throw"]]
                    old = branches.get(key)
                    if old is None or len(old) < len(taken):
                        merged = taken if old is None else [
                            t or (i < len(old) and old[i]) for i, t in enumerate(taken)]
                        branches[key] = merged
                    elif len(old) == len(taken):
                        branches[key] = [a or b for a, b in zip(old, taken)]
    print(f"{with_data} of {len(targets)} passed test targets left coverage data")
    if not lines:
        sys.exit("coverage: no coverage of lib/ or python/ext in any report")
    per = collections.defaultdict(lambda: [0, 0, 0, 0])  # lines, hit, branches, taken
    excluded = collections.Counter()
    uncovered_errors = []
    for (path, n), (count, unexec) in sorted(lines.items()):
        ex = next((p for p in EXCLUDED if path.startswith(p)), None)
        if ex:
            excluded[ex] += 1
            continue
        c = per[os.path.dirname(path)]
        c[0] += 1
        c[1] += count > 0
        b = branches.get((path, n), [])
        c[2] += len(b)
        c[3] += sum(b)
        if count == 0 or unexec:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read().splitlines()
            src = text[n - 1].strip() if n <= len(text) else ""
            # `case errc::x: return "..."` names an error, it is no path to one.
            if ERROR_LINE.search(src) and not src.startswith("case "):
                uncovered_errors.append((path, n, "never ran" if count == 0 else "partly", src))

    def pct(a, b):
        return f"{100 * a / b:5.1f} %" if b else "    -  "

    print(f"{'folder':24} {'lines':>8} {'covered':>9} {'line %':>8} {'branches':>9} "
          f"{'taken':>7} {'branch %':>9}")
    tot = [0, 0, 0, 0]
    for folder in sorted(per):
        c = per[folder]
        tot = [a + b for a, b in zip(tot, c)]
        print(f"{folder:24} {c[0]:8} {c[1]:9} {pct(c[1], c[0]):>8} {c[2]:9} {c[3]:7} "
              f"{pct(c[3], c[2]):>9}")
    print(f"{'all measured':24} {tot[0]:8} {tot[1]:9} {pct(tot[1], tot[0]):>8} {tot[2]:9} "
          f"{tot[3]:7} {pct(tot[3], tot[2]):>9}")
    for ex, n in sorted(excluded.items()):
        print(f"excluded: {ex} ({n} lines): {EXCLUDED[ex]}")
    print(f"\nerror paths no test reached ({len(uncovered_errors)}):")
    for path, n, how, src in uncovered_errors:
        print(f"  {path}:{n}: [{how}] {src[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
