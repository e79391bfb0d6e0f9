"""tools/mutate/coverage_map.py — coverage-guided test selection for
tools/mutate/mutate.py --coverage (docs/reliability.md "Generated
mutants"). Pure file work, no Bazel: tools/mutate/coverage_map_test.py
tests it on fabricated coverage.dat files.

A mutant can only change the result of a test that executes the mutated
line. `bazel coverage` (tools/coverage.sh) leaves, for each test target,
a coverage.dat under the gcov testlogs tree: one gcov JSON document per
line (bazel/shims/remote_coverage_tools), whose files' paths are
execroot-relative (`lib/pipeline/consumer.cpp`), each with its executable
lines and their counts. From them, per source line: the tests that ran it,
and whether any object compiled it at all (gcov has a record for it).

`select()` then decides, conservatively, for a mutant of file F spanning
lines a..b, among the tests that depend on F (`rdeps`):

  rdeps      fall back to every dependent test, the way a run without
             coverage does, when the data cannot be trusted for F: F is a
             header (an inline function's or template's copy the linker
             keeps may be one compiled outside the instrumented code, a
             test's or an example's, so its runs are not counted against
             F), F or any other measured source changed since the coverage
             was taken (the caller says which files changed), no test has
             a record of F, line a has no record (not executable to gcov: a
             declaration, a member initializer, one line of a statement gcov
             puts elsewhere), or a..b lies in a constexpr or consteval
             function (what it computes at compile time runs in no test).
  coverage   the dependent tests that ran a line of a..b, plus those the
             data cannot speak for: a dependent test with no coverage.dat
             (not run under coverage, failed, or newer than it), whose own
             sources changed since, or that runs the library in a process
             whose counts are lost (a fork ended by _exit, a child killed
             or spawned: `opaque`).
  uncovered  line a is executable, no test ran any line of a..b, and every
             dependent test's data speaks for it: the mutant is a survivor
             without building anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

# The sources whose lines are mapped (what .bazelrc instruments); a file
# elsewhere in a test's data (its own test/*.cpp) only says what the test is.
MEASURED = ("lib/", "python/", "tools/")
HEADER_SUFFIXES = (".hpp", ".h", ".hh", ".ipp", ".inl")
# A test that starts processes whose gcov counts may be lost: a fork whose
# child ends in _exit (no atexit, so no .gcda written), a child killed or
# spawned. Its coverage is only a lower bound, so it is always run.
SPAWN = re.compile(r"\bfork\s*\(|\bposix_spawn|\bexec[lv]p?e?\s*\(|\b_exit\s*\(|\bsubprocess\b"
                   r"|\bPopen\b|\bos\.fork\b|\bos\._exit\b|\bmultiprocessing\b|\bpopen\s*\(")
def library_file(path: str) -> bool:
    """Whether a change to `path` may change which lines of the library
    the tests run: a source or BUILD file of the library, the Python
    package or the CLI (tools/*.cpp, *.hpp), not the tests, tools/mutate or
    the docs."""
    if path.startswith(("lib/", "python/ext/", "python/src/")) or path == "python/BUILD.bazel":
        return True
    return path.startswith("tools/") and path.count("/") == 1 and \
        path.endswith((".cpp", ".hpp", ".h", ".cc", "BUILD.bazel"))


CONSTEXPR = re.compile(r"\b(constexpr|consteval)\b")


@dataclasses.dataclass
class CoverageMap:
    hits: dict          # (file, line) -> set of test labels whose count > 0
    executable: set     # (file, line) with a gcov record in some test
    files: dict         # file -> set of test labels with a record of it
    tests: set          # labels with a coverage.dat
    own_sources: dict   # label -> set of its non-measured repo files (test/x.cpp)
    functions: dict     # file -> set of (start_line, end_line)

    def tests_of(self, path, line):
        return self.hits.get((path, line), set())


def normalise(path: str) -> str | None:
    """A gcov file path as repo-relative, or None for what is not the
    repository's (system headers, external/)."""
    p = os.path.normpath(path)
    if p.startswith("/"):
        # An absolute sandbox path: .../execroot/<ws>/lib/x.cpp.
        m = re.search(r"/execroot/[^/]+/(.*)$", p)
        if not m:
            return None
        p = m.group(1)
    if p.startswith(("external/", "bazel-out/", "..")):
        return None
    return p


def label_of(testlogs: str, dat: str, repo: str) -> str:
    """The test label of a coverage.dat under testlogs: <pkg>/<name>/coverage.dat,
    the package the longest leading folder with a BUILD file in `repo`."""
    rel = os.path.relpath(os.path.dirname(dat), testlogs).split(os.sep)
    for k in range(len(rel) - 1, -1, -1):
        pkg = "/".join(rel[:k])
        if any(os.path.isfile(os.path.join(repo, pkg, b)) for b in ("BUILD.bazel", "BUILD")):
            return f"//{pkg}:{'/'.join(rel[k:])}"
    return f"//{'/'.join(rel[:-1])}:{rel[-1]}"


def load(testlogs: str, repo: str, only=None) -> CoverageMap:
    """The map of every coverage.dat under testlogs, or of the tests in
    `only` (labels) when given: a coverage.dat of another test is an
    earlier run's, of other sources."""
    hits, executable, files, tests, own, functions = {}, set(), {}, set(), {}, {}
    for d, _, names in sorted(os.walk(testlogs)):
        if "coverage.dat" not in names:
            continue
        dat = os.path.join(d, "coverage.dat")
        label = label_of(testlogs, dat, repo)
        if only is not None and label not in only:
            continue
        docs = 0
        with open(dat, encoding="utf-8") as f:
            for ln in f:
                if not ln.startswith("{"):
                    continue
                docs += 1
                for rec in json.loads(ln).get("files", []):
                    path = normalise(rec["file"])
                    if path is None:
                        continue
                    if not path.startswith(MEASURED):
                        own.setdefault(label, set()).add(path)
                        continue
                    files.setdefault(path, set()).add(label)
                    for fn in rec.get("functions", []):
                        functions.setdefault(path, set()).add((fn["start_line"], fn["end_line"]))
                    for line in rec.get("lines", []):
                        key = (path, line["line_number"])
                        executable.add(key)
                        if line["count"] > 0:
                            hits.setdefault(key, set()).add(label)
        if docs:
            tests.add(label)
    return CoverageMap(hits, executable, files, tests, own, functions)


def main_source(label: str, repo: str) -> str | None:
    """The file a test target is named after: //pkg:name_test is
    pkg/name_test.cpp (or .cc), //python:test_x python/tests/test_x.py;
    None when there is none (a shell test, a name of another form)."""
    pkg, _, name = label.removeprefix("//").partition(":")
    for rel in (f"{pkg}/{name}.cpp", f"{pkg}/{name}.cc", f"{pkg}/tests/{name}.py"):
        if os.path.isfile(os.path.join(repo, rel)):
            return rel
    return None


def own_source_files(cov: CoverageMap, label: str, repo: str) -> list[str]:
    """The test's own sources, to read for process spawning: its main
    source (main_source: gcov has no record of a test's own objects, which
    are not instrumented), the non-library files in its coverage data, and
    the test/ headers they include or the python/tests modules they import.
    Empty when the main source is not known."""
    main = main_source(label, repo)
    if main is None:
        return []
    out = [main] + [p for p in sorted(cov.own_sources.get(label, ()))
                    if os.path.isfile(os.path.join(repo, p))]
    seen, queue = set(), list(out)
    while queue:
        p = queue.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(os.path.join(repo, p), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if p.endswith(".py"):
            for m in re.finditer(r"^\s*(?:from|import)\s+(\w+)", text, re.M):
                q = os.path.join(os.path.dirname(p), m.group(1) + ".py")
                if os.path.isfile(os.path.join(repo, q)):
                    queue.append(q)
        else:
            for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
                for q in (m.group(1), os.path.join(os.path.dirname(p), m.group(1))):
                    q = os.path.normpath(q)
                    if not q.startswith(MEASURED) and os.path.isfile(os.path.join(repo, q)):
                        queue.append(q)
    return sorted(seen)


def opaque(cov: CoverageMap, label: str, repo: str) -> bool:
    """Whether the test's coverage may miss what it ran: it starts
    processes, or its main source is not known (a shell test)."""
    srcs = own_source_files(cov, label, repo)
    if not srcs:
        return True
    for p in srcs:
        with open(os.path.join(repo, p), encoding="utf-8", errors="replace") as f:
            if SPAWN.search(f.read()):
                return True
    return False


def in_constexpr(cov: CoverageMap, path: str, first: int, last: int, lines: list[str]) -> bool:
    """Whether lines first..last lie in a function gcov knows whose head
    (from its first line to its body's brace) says constexpr or consteval;
    also true when no gcov function encloses them and the nearest
    preceding line that opens a definition does (the conservative
    answer)."""
    enclosing = [(s, e) for s, e in cov.functions.get(path, ()) if s <= first and last <= e]
    for s, _ in enclosing:
        head = []
        for k in range(s - 1, min(first, len(lines))):
            head.append(lines[k])
            if "{" in lines[k]:
                break
        # A template's or a function's head may start on the lines above
        # gcov's start line (the return type, the template parameters).
        head = lines[max(0, s - 3):s - 1] + head
        if CONSTEXPR.search("\n".join(head)):
            return True
    return False


@dataclasses.dataclass
class Selection:
    by: str         # "coverage", "uncovered" or "rdeps"
    tests: list     # the tests to run (empty for uncovered)
    reason: str     # why, in a few words (for the results row)


def select(cov: CoverageMap, path: str, first: int, last: int, rdeps: list[str],
           changed: set, repo: str, text: str | None = None) -> Selection:
    """Which of the dependent tests `rdeps` a mutant of `path` spanning
    lines first..last must run (module docstring). `changed`: the files
    that differ between the tree the coverage was taken of and the tree
    mutated; `text`: the file's source (read from repo when None)."""
    every = sorted(rdeps)
    if path.endswith(HEADER_SUFFIXES):
        return Selection("rdeps", every, "a header: its lines may run in copies outside the data")
    measured_changed = sorted(c for c in changed if library_file(c))
    if path in changed:
        return Selection("rdeps", every, "the file changed since the coverage was taken")
    if measured_changed:
        return Selection("rdeps", every, f"{measured_changed[0]} changed since the coverage "
                         "was taken (who calls what may differ)")
    if path not in cov.files:
        return Selection("rdeps", every, "no test has coverage data of the file")
    if (path, first) not in cov.executable:
        return Selection("rdeps", every, f"line {first} is not executable to gcov")
    if text is None:
        with open(os.path.join(repo, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
    if in_constexpr(cov, path, first, last, text.splitlines()):
        return Selection("rdeps", every, "a constexpr or consteval function")
    ran = set()
    for n in range(first, last + 1):
        ran |= cov.tests_of(path, n)
    if ran and not ran & set(every):
        return Selection("rdeps", every, "only tests outside the dependent ones ran the line")
    unknown = set()
    for t in every:
        if t in ran:
            continue
        if t not in cov.tests:
            unknown.add(t)  # no coverage.dat: not run under coverage, failed, or new
        elif any(s in changed for s in cov.own_sources.get(t, ())) or \
                any(s in changed for s in own_source_files(cov, t, repo)):
            unknown.add(t)  # the test changed since
        elif opaque(cov, t, repo):
            unknown.add(t)
    chosen = sorted((ran & set(every)) | unknown)
    if not chosen and not ran:
        return Selection("uncovered", [], f"line {first} is executable and no test ran it")
    reason = (f"{len(ran & set(every))} ran the line, {len(unknown)} whose data cannot say "
              f"(of {len(every)})")
    return Selection("coverage", chosen, reason)
