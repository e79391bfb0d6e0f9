#!/usr/bin/python3
"""tools/mutate/mutate.py — blobpipe's own mutation run (docs/reliability.md
"Mutation run"). Run by hand, not in CI.

Each mutant in tools/mutate/catalogue.txt is one small deliberate bug: a
check removed, a bound off by one, a result swapped. Its `find` text must
occur exactly once in its file, so a refactor that moves the site fails
loudly ("pattern-missing" / "ambiguous") instead of silently skipping it.
The run copies the repository's HEAD into one reused scratch clone (outside
the repository), checks that the selected mutants' tests pass there
unmutated, then for each mutant: applies it, runs its tests with
bazel/bazelw, restores the file. A mutant is

  killed      its tests failed (a test failure, a timeout or a crash)
  survived    every test passed: no test notices the bug
  unbuildable the mutant did not compile (fix the catalogue entry)
  pattern-missing / ambiguous   its text occurs 0 / more than 1 times

Usage (from anywhere in the repository):

  tools/mutate/mutate.py --list                 # the catalogue
  tools/mutate/mutate.py --check                # every pattern occurs once (seconds)
  tools/mutate/mutate.py                        # every mutant
  tools/mutate/mutate.py --only 'decoder|group' # names matching a regex
  tools/mutate/mutate.py --budget 30            # stop starting mutants after 30 min

Generated mutants (tools/mutate/generate.py; docs/reliability.md
"Generated mutants"): made by operators from the sources instead of the
catalogue, drawn at random with a seed, each run against the tests that
depend on its file (bazel query rdeps), nearest tests first:

  tools/mutate/mutate.py --generate 50 --seed 7 --paths lib/format python/ext
  tools/mutate/mutate.py --generate 50 --seed 7 --list    # the draw, no run
  tools/mutate/mutate.py --generate 300 --seed 7 --budget 60   # a slice

With --coverage (tools/mutate/coverage_map.py), each mutant runs only the
dependent tests that ran its line in the whole suite's coverage
(tools/coverage.sh, gcov, one coverage.dat per test); a line gcov counts
as executable that no test ran is "survived (uncovered)" at once, with
nothing built; where the data cannot speak for the line (a header, a line
with no gcov record, a constexpr function, a library file changed since
the coverage was taken) every dependent test runs, as without it. Each
row says which (tests_selected_by: coverage / rdeps):

  tools/coverage.sh                                        # once, the whole suite
  tools/mutate/mutate.py --generate 300 --seed 41 --paths lib/pipeline --coverage

Results go to a file (--results, default beside the scratch clone) as one
JSON line per mutant; a run with the same seed skips the mutants it
already has a verdict for that still holds (a kill while the file is
unchanged; a survivor only on the same commit), so slices of --budget
minutes add up to the whole sample, and survivors are tried again after a
test is added. Mutants named in tools/mutate/equivalent.txt (with the reason
no test can kill them) are left out of the score; the rest are scored per
folder: killed / (killed + survived). A mutant that does not compile is
unbuildable and outside the score.

Options: --scratch DIR (default $TMPDIR/blobpipe-mutate), --catalogue FILE,
--mutant-timeout SECONDS (default 900; a mutant whose tests run longer is
reported as "timeout" and counted as killed, since the suite would fail),
--no-baseline. Commits only: uncommitted changes are not in the scratch
clone (the run says so). The exit status is 1 when any mutant survived, was
unbuildable, or its pattern did not match exactly once.

Catalogue format: one block per mutant; '#' starts a comment line.

  [decoder.tail-row-bound]
  file: lib/protocol/decoder.cpp
  find: if (h.length > FOOTER_SIZE + b->max_index_bytes)
  replace: if (false)
  tests: //test:decoder_test
  rule: docs/wire.md "Limits": a tail no longer than an index of the rows announced

A value continues on the following lines that begin with '|' (the rest of
such a line, after '|' and one optional space, joined with a newline), for
patterns spanning lines. `tests` is one or more Bazel test labels
separated by spaces.
"""

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import coverage_map
import generate

KEYS = ("file", "find", "replace", "tests", "rule")

# Generated mutants come from these: the library, the Python package and
# the CLI (the C++ files at the top of tools/; tools/mutate and the scripts
# are not the product). A folder given with --paths is taken whole, less
# tools/mutate.
DEFAULT_PATHS = ("lib", "python/ext", "python/src", "tools/*.cpp", "tools/*.hpp")
EXCLUDED_PATHS = ("tools/mutate",)


class Mutant:
    def __init__(self, name, fields, line):
        self.name = name
        self.line = line
        self.file = fields["file"]
        self.find = fields["find"]
        self.replace = fields["replace"]
        self.tests = fields["tests"].split()
        self.rule = fields["rule"]


def parse_catalogue(path):
    mutants, names = [], set()
    name, fields, start, last = None, {}, 0, None

    def finish():
        if name is None:
            return
        missing = [k for k in KEYS if k not in fields]
        if missing:
            sys.exit(f"{path}:{start}: [{name}] lacks {', '.join(missing)}")
        if fields["find"] == fields["replace"]:
            sys.exit(f"{path}:{start}: [{name}] replaces its text with itself")
        mutants.append(Mutant(name, fields, start))

    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if line.startswith("#") or not line.strip():
                continue
            if line.startswith("["):
                finish()
                m = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", line.strip())
                if not m:
                    sys.exit(f"{path}:{n}: bad mutant name line: {line}")
                name, fields, start, last = m.group(1), {}, n, None
                if name in names:
                    sys.exit(f"{path}:{n}: mutant [{name}] named twice")
                names.add(name)
                continue
            if name is None:
                sys.exit(f"{path}:{n}: text before the first [name]")
            if line.startswith("|"):
                if last is None:
                    sys.exit(f"{path}:{n}: continuation line with no key before it")
                rest = line[1:]
                fields[last] += "\n" + (rest[1:] if rest.startswith(" ") else rest)
                continue
            m = re.fullmatch(r"([a-z]+):(?: (.*))?", line)
            if not m or m.group(1) not in KEYS:
                sys.exit(f"{path}:{n}: expected one of {', '.join(KEYS)}: {line}")
            if m.group(1) in fields:
                sys.exit(f"{path}:{n}: [{name}] has {m.group(1)} twice")
            last = m.group(1)
            fields[last] = m.group(2) or ""
    finish()
    return mutants


def occurrences(root, m):
    path = os.path.join(root, m.file)
    if not os.path.isfile(path):
        return -1
    with open(path, encoding="utf-8") as f:
        return f.read().count(m.find)


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def prepare_scratch(repo, scratch):
    if not os.path.isdir(os.path.join(scratch, ".git")):
        if os.path.exists(scratch):
            sys.exit(f"mutate: {scratch} exists and is not a git clone; remove it or pass --scratch")
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", repo, scratch], check=True)
    git("fetch", "--quiet", repo, "HEAD", cwd=scratch)
    git("checkout", "--quiet", "--force", "--detach", "FETCH_HEAD", cwd=scratch)
    git("clean", "-fdq", cwd=scratch)
    return git("rev-parse", "--short", "HEAD", cwd=scratch).strip()


def shared_env(repo, environ):
    """`environ` with the golden blobs and the reference codec beside the
    repository (../shared) as defaults. bazel/bazelw finds them from its own
    clone, and the scratch clone has no ../shared: without them the golden
    and reference cases would skip and kill nothing."""
    env = dict(environ)
    shared = os.path.abspath(os.path.join(repo, "..", "shared"))
    golden = os.path.join(shared, "golden")
    reference = os.path.join(shared, "reference", "blob_format.py")
    if "BLOBPIPE_GOLDEN_DIR" not in env and os.path.isdir(golden):
        env["BLOBPIPE_GOLDEN_DIR"] = golden
    if "BLOBPIPE_REFERENCE" not in env and os.path.isfile(reference):
        env["BLOBPIPE_REFERENCE"] = reference
    return env


def bazel_test(scratch, targets, timeout, log_path, env, flags=()):
    """Runs the targets' tests; returns (status, seconds). The first test
    that fails ends the run (--notest_keep_going, which --keep_going would
    override): one failure is a kill, and the other tests need not run."""
    start = time.monotonic()
    cmd = ["bazel/bazelw", "test", "--notest_keep_going",
           "--test_output=errors", *flags, *targets]
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            r = subprocess.run(cmd, cwd=scratch, stdout=log, stderr=subprocess.STDOUT,
                               timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return "timeout", time.monotonic() - start
    took = time.monotonic() - start
    with open(log_path, encoding="utf-8", errors="replace") as log:
        text = log.read()
    return test_verdict(r.returncode, text), took


def test_verdict(returncode, text):
    """The verdict on a mutant from `bazel test`'s exit code and output:
    "passed", "failed" (a test failed: killed), "unbuildable" or "bazel
    exit N". Bazel's exit codes: 0 all passed, 3 a test failed, 1 a build
    failed, 4 no test ran."""
    # A target that failed to build is the mutant's fault, not a kill.
    if re.search(r"^//\S+\s+FAILED TO BUILD", text, re.M):
        return "unbuildable"
    if returncode == 0:
        return "passed"
    # A failing test stops the run (exit 1): the tests it cut short say NO
    # STATUS, as do tests a failed build kept from running.
    if re.search(r"^//\S+\s+(\(cached\) )?(FAILED in|TIMEOUT in)", text, re.M):
        return "failed"
    if returncode == 3:
        return "failed"
    if returncode == 1:
        return "unbuildable"
    return f"bazel exit {returncode}"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.abspath(os.path.join(here, "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    default_catalogue = os.path.join(here, "catalogue.txt")
    ap.add_argument("--catalogue", default=default_catalogue,
                    help="default: tools/mutate/catalogue.txt, as committed (HEAD's) for a run")
    ap.add_argument("--only", help="run the mutants whose names match this regex")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--check", action="store_true",
                    help="check every pattern occurs exactly once in the tree, and exit")
    ap.add_argument("--budget", type=float, default=0,
                    help="minutes; no mutant is started after this (0: no limit)")
    ap.add_argument("--scratch",
                    default=os.path.join(tempfile.gettempdir(), "blobpipe-mutate"))
    ap.add_argument("--mutant-timeout", type=int, default=900)
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip running the selected tests unmutated first")
    ap.add_argument("--keep-server", action="store_true",
                    help="leave the scratch clone's Bazel server running")
    ap.add_argument("--generate", type=int, metavar="N",
                    help="draw N generated mutants instead of running the catalogue")
    ap.add_argument("--seed", type=int, default=1, help="the draw's seed (--generate)")
    ap.add_argument("--paths", nargs="+", default=list(DEFAULT_PATHS),
                    help="folders or files to draw from (--generate; default: %(default)s)")
    ap.add_argument("--ops", default=",".join(generate.OPERATORS),
                    help="operators, comma separated (--generate; default: all)")
    ap.add_argument("--results", help="JSON lines file of verdicts, resumed from (--generate; "
                    "default: <scratch>-seed<SEED>.jsonl)")
    ap.add_argument("--equivalents", default=os.path.join(here, "equivalent.txt"))
    ap.add_argument("--test-timeout", type=int, metavar="SECONDS",
                    help="Bazel's --test_timeout for every test of a generated mutant: a test "
                    "that hangs fails (killed) after this, not after its size's limit; give "
                    "it a few times the slowest test's time")
    ap.add_argument("--coverage", nargs="?", const="auto", metavar="TESTLOGS",
                    help="select each mutant's tests by the whole suite's coverage "
                    "(tools/coverage.sh): only the tests that ran the mutated line; a line "
                    "no test ran is 'survived (uncovered)' without a build. TESTLOGS: the "
                    "gcov testlogs tree (default: the repository's, from bazel info)")
    ap.add_argument("--coverage-commit", metavar="REV",
                    help="the commit the coverage was taken at (default: the "
                    "coverage-source.json that tools/coverage.sh leaves in TESTLOGS)")
    ap.add_argument("--nearest-only", action="store_true",
                    help="run only the nearest ring of dependent tests (--generate): faster, "
                    "and a survivor is then only a candidate")
    args = ap.parse_args()
    if args.generate is not None:
        return run_generated(args, repo)

    mutants = parse_catalogue(args.catalogue)
    if args.only:
        rx = re.compile(args.only)
        mutants = [m for m in mutants if rx.search(m.name)]
    if not mutants:
        sys.exit("mutate: no mutant selected")

    if args.list:
        for m in mutants:
            print(f"{m.name:44} {m.file:36} {' '.join(m.tests)}\n    {m.rule}")
        return 0

    if args.check:
        bad = 0
        for m in mutants:
            n = occurrences(repo, m)
            if n != 1:
                bad += 1
                what = "no such file" if n < 0 else f"{n} occurrences"
                print(f"{'pattern-missing' if n <= 0 else 'ambiguous'}: [{m.name}] {m.file}: {what}")
        print(f"mutate --check: {len(mutants) - bad} of {len(mutants)} patterns occur exactly once")
        return 1 if bad else 0

    scratch = os.path.abspath(args.scratch)
    if scratch == repo or scratch.startswith(repo + os.sep):
        sys.exit("mutate: the scratch clone must be outside the repository")
    if git("status", "--porcelain", "--untracked-files=no", cwd=repo).strip():
        print("mutate: the working tree has uncommitted changes; the run mutates HEAD only")
    head = prepare_scratch(repo, scratch)
    if args.catalogue == default_catalogue:
        # The mutants of the commit being run, not of the working tree: a
        # block added but not committed may name a target HEAD lacks.
        mutants = parse_catalogue(os.path.join(scratch, os.path.relpath(default_catalogue, repo)))
        if args.only:
            mutants = [m for m in mutants if rx.search(m.name)]
        if not mutants:
            sys.exit("mutate: no mutant selected in HEAD's catalogue")
    env = shared_env(repo, os.environ)
    cov, changed = load_coverage(args, repo, head, env)
    logs = os.path.join(scratch, ".mutate-logs")
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs)
    print(f"mutate: {len(mutants)} mutants on {head}, scratch clone {scratch}, logs {logs}")
    t0 = time.monotonic()

    if not args.no_baseline:
        targets = sorted({t for m in mutants for t in m.tests})
        status, took = bazel_test(scratch, targets, None, os.path.join(logs, "baseline.log"), env)
        print(f"baseline: {status} in {took:.0f} s ({len(targets)} targets)", flush=True)
        if status != "passed":
            sys.exit(f"mutate: the unmutated tests do not pass; see {logs}/baseline.log")

    results = []
    for m in mutants:
        if args.budget and time.monotonic() - t0 > args.budget * 60:
            results.append((m, "not run", 0.0))
            continue
        path = os.path.join(scratch, m.file)
        n = occurrences(scratch, m)
        if n != 1:
            status = "pattern-missing" if n <= 0 else "ambiguous"
            results.append((m, status, 0.0))
            print(f"{status:15} {0:6.0f} s  {m.name}", flush=True)
            continue
        with open(path, encoding="utf-8") as f:
            original = f.read()
        tests = m.tests
        if cov is not None:
            first = original.count("\n", 0, original.index(m.find)) + 1
            sel = coverage_map.select(cov, m.file, first, first + m.find.count("\n"), m.tests,
                                      changed, scratch, original)
            if sel.by == "uncovered":
                results.append((m, "survived (uncovered)", 0.0))
                print(f"{'survived (uncovered)':15} {0:6.0f} s  {m.name}", flush=True)
                continue
            tests = sel.tests
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original.replace(m.find, m.replace, 1))
            status, took = bazel_test(scratch, tests, args.mutant_timeout,
                                      os.path.join(logs, m.name + ".log"), env)
        finally:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original)
        verdict = {"failed": "killed", "passed": "survived", "timeout": "killed (timeout)"}.get(
            status, status)
        results.append((m, verdict, took))
        print(f"{verdict:15} {took:6.0f} s  {m.name}", flush=True)

    total = time.monotonic() - t0
    if not args.keep_server:
        subprocess.run(["bazel/bazelw", "shutdown"], cwd=scratch, env=env,
                       capture_output=True)
    counts = {}
    for _, v, _ in results:
        key = "killed" if v.startswith("killed") else v
        counts[key] = counts.get(key, 0) + 1
    print()
    for m, v, _ in results:
        if not v.startswith("killed") and v != "not run":
            print(f"{v}: [{m.name}] {m.file} — {m.rule}\n    tests: {' '.join(m.tests)}; "
                  f"log: {logs}/{m.name}.log")
    print(f"mutate: {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))} "
          f"of {len(results)} in {total / 60:.1f} min ({head})")
    bad = sum(n for k, n in counts.items() if k not in ("killed", "not run"))
    return 1 if bad else 0


# ---------------------------------------------------------------- generated mutants

def source_files(root, paths):
    """The C++ and Python sources under `paths` (relative to root), sorted,
    tools/mutate left out."""
    out = []
    for p in paths:
        full = os.path.join(root, p)
        if any(c in p for c in "*?["):
            walk = [(os.path.dirname(f), [], [os.path.basename(f)])
                    for f in sorted(glob.glob(full))]
        elif os.path.isfile(full):
            walk = [(os.path.dirname(full), [], [os.path.basename(full)])]
        else:
            walk = os.walk(full)
        for d, dirs, files in walk:
            dirs.sort()
            for f in sorted(files):
                rel = os.path.relpath(os.path.join(d, f), root)
                if rel.startswith(tuple(x + os.sep for x in EXCLUDED_PATHS)):
                    continue
                if f.endswith(generate.CPP_SUFFIXES + generate.PY_SUFFIXES) and \
                        not f.endswith("_test.py"):
                    out.append(rel)
    return sorted(set(out))


def file_label(root, rel):
    """The Bazel label of a source file: its nearest package."""
    d = os.path.dirname(rel)
    while True:
        if any(os.path.isfile(os.path.join(root, d, b)) for b in ("BUILD.bazel", "BUILD")):
            pkg = d
            break
        if not d:
            return None
        d = os.path.dirname(d)
    name = os.path.relpath(rel, pkg) if pkg else rel
    return f"//{pkg}:{name}"


def bazel_query(scratch, expr, env, *flags):
    r = subprocess.run(["bazel/bazelw", "query", "--keep_going", *flags, expr], cwd=scratch,
                       env=env, capture_output=True, text=True)
    if r.returncode not in (0, 3):  # 3: some of it could not be evaluated
        return None
    return [ln for ln in r.stdout.splitlines() if ln.strip()]


def dependent_tests(scratch, rel, env):
    """The test targets that depend on the file, not manual, in two rings:
    [[the nearest: fewest dependency edges away], [the rest]] (empty rings
    left out)."""
    label = file_label(scratch, rel)
    if label is None:
        return []

    def tests(depth=None):
        within = f"rdeps(//..., {label}{'' if depth is None else f', {depth}'})"
        return set(bazel_query(scratch, f'kind(".*_test", {within}) '
                               f'except attr(tags, "manual", //...)', env) or [])

    every = tests()
    nearest = set()
    for depth in range(1, 9):
        nearest = tests(depth)
        if nearest:
            break
    return [sorted(r) for r in (nearest, every - nearest) if r]


def load_results(path):
    """{mutant name: [its rows, oldest first]}."""
    out = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for ln in f:
                if ln.strip():
                    r = json.loads(ln)
                    out.setdefault(r["name"], []).append(r)
    return out


def reusable(rows, head, repo, nearest_only):
    """The latest earlier verdict that still holds at `head`, or None. A
    kill (or a mutant that did not build) holds while its file is the same
    (tests are only ever added); a survivor is run again after any commit,
    as a new test may kill it, and a survivor of the nearest ring alone when
    the whole run is asked for."""
    for r in reversed(rows):
        if r["verdict"] == "not run":
            continue
        if r["head"] == head:
            if r["verdict"] == "survived (nearest)" and not nearest_only:
                return None
            return r
        if r["verdict"].startswith("killed") or r["verdict"] in ("unbuildable", "no tests"):
            try:
                same = (git("rev-parse", f"{r['head']}:{r['file']}", cwd=repo) ==
                        git("rev-parse", f"{head}:{r['file']}", cwd=repo))
            except subprocess.CalledProcessError:
                same = False
            if same:
                return r
        return None
    return None


def coverage_testlogs(repo, env):
    """The gcov testlogs tree of the repository (tools/coverage.sh's)."""
    r = subprocess.run(["bazel/bazelw", "info", "--symlink_prefix=/", "--platform_suffix=gcov",
                        "bazel-testlogs"], cwd=repo, env=env, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def load_coverage(args, repo, head, env):
    """(the coverage map, the files changed since it was taken), or
    (None, None) without --coverage. Exits when the data or its commit
    cannot be found."""
    if not args.coverage:
        return None, None
    testlogs = args.coverage
    if testlogs == "auto":
        testlogs = coverage_testlogs(repo, env)
    if not testlogs or not glob.glob(os.path.join(testlogs, "**", "coverage.dat"),
                                     recursive=True):
        sys.exit(f"mutate: no coverage.dat under {testlogs or 'the gcov testlogs'}; "
                 "run tools/coverage.sh first")
    commit, dirty, passed = args.coverage_commit, [], None
    stamp = os.path.join(testlogs, "coverage-source.json")
    if os.path.isfile(stamp):
        with open(stamp, encoding="utf-8") as f:
            src = json.load(f)
        commit, dirty = commit or src["commit"], src.get("dirty", [])
        passed = set(src["tests"]) if "tests" in src else None
    if commit is None or commit == "unknown":
        sys.exit(f"mutate: which commit the coverage under {testlogs} was taken at is not "
                 "known (no coverage-source.json); pass --coverage-commit")
    try:
        changed = set(git("diff", "--name-only", commit, head, cwd=repo).split())
    except subprocess.CalledProcessError:
        sys.exit(f"mutate: the coverage's commit {commit} is not in this repository")
    changed |= set(dirty)
    t = time.monotonic()
    cov = coverage_map.load(testlogs, repo, passed)
    print(f"mutate: coverage of {len(cov.tests)} tests from {testlogs} (taken at {commit[:12]}"
          f"{', with uncommitted changes' if dirty else ''}; {len(changed)} files changed "
          f"since), read in {time.monotonic() - t:.0f} s", flush=True)
    return cov, changed


def covered_rings(cov, changed, m, rings, root, text):
    """The rings of dependent tests that a generated mutant `m` runs with
    coverage-guided selection (coverage_map.select), as (rings,
    tests_selected_by, reason): ("coverage" with the rings narrowed to the
    tests selected, nearest first; no ring left: no test ran the line),
    or ("rdeps" with the rings unchanged)."""
    last = m.line + m.before.count("\n")
    sel = coverage_map.select(cov, m.file, m.line, last, [t for r in rings for t in r],
                              changed, root, text)
    if sel.by == "rdeps":
        return rings, "rdeps", sel.reason
    if sel.by == "uncovered":
        return [], "coverage", sel.reason
    narrowed = [[t for t in r if t in sel.tests] for r in rings]
    return [r for r in narrowed if r], "coverage", sel.reason


def folder_of(rel):
    return os.path.dirname(rel)


def score_lines(rows, equivalents):
    """Per folder and in all: killed, survived, equivalent, unbuildable,
    and the score killed / (killed + survived)."""
    folders = {}
    for r in rows:
        f = folders.setdefault(folder_of(r["file"]), {})
        v = "equivalent" if r["name"] in equivalents else r["verdict"]
        v = "killed" if v.startswith("killed") else v
        # A survivor of the nearest ring alone, or of a line no test ran,
        # counts as a survivor; the latter are also counted apart.
        if v == "survived (uncovered)":
            f["uncovered"] = f.get("uncovered", 0) + 1
        v = "survived" if v.startswith("survived") else v
        f[v] = f.get(v, 0) + 1
    total = {}
    lines = []
    for folder in sorted(folders) + ["all"]:
        c = folders.get(folder, total)
        if folder != "all":
            for k, n in c.items():
                total[k] = total.get(k, 0) + n
        k, sv = c.get("killed", 0), c.get("survived", 0)
        score = f"{100 * k / (k + sv):5.1f} %" if k + sv else "    -  "
        known = {"killed", "survived", "equivalent", "unbuildable", "uncovered"}
        lines.append(f"  {folder:22} {score}  killed {k:3}  survived {sv:3} "
                     f"(uncovered {c.get('uncovered', 0):3})  "
                     f"equivalent {c.get('equivalent', 0):3}  unbuildable {c.get('unbuildable', 0):3}"
                     + (f"  other {sum(n for x, n in c.items() if x not in known)}"
                        if set(c) - known else ""))
    return lines


def run_generated(args, repo):
    # A run stopped with kill (SIGTERM) still restores the mutated file
    # (the `finally` below); SIGINT may be ignored in a background job.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in ops if o not in generate.OPERATORS]
    if bad:
        sys.exit(f"mutate: unknown operators {bad}; known: {', '.join(generate.OPERATORS)}")
    equivalents = generate.parse_equivalents(args.equivalents) if os.path.isfile(
        args.equivalents) else {}
    scratch = os.path.abspath(args.scratch)
    if args.list:
        root, head = repo, git("rev-parse", "--short", "HEAD", cwd=repo).strip()
    else:
        if scratch == repo or scratch.startswith(repo + os.sep):
            sys.exit("mutate: the scratch clone must be outside the repository")
        if git("status", "--porcelain", "--untracked-files=no", cwd=repo).strip():
            print("mutate: the working tree has uncommitted changes; the run mutates HEAD only")
        head = prepare_scratch(repo, scratch)
        root = scratch
    candidates = []
    for rel in source_files(root, args.paths):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            candidates += generate.mutants_of(rel, f.read(), ops)
    drawn = generate.sample(candidates, args.generate, args.seed)
    print(f"mutate: {len(drawn)} of {len(candidates)} generated mutants, seed {args.seed}, "
          f"on {head}, from {' '.join(args.paths)}")
    if args.list:
        for m in drawn:
            mark = "  [equivalent]" if m.name in equivalents else ""
            print(f"{m.name}{mark}\n    {m.describe()}")
        return 0

    results_path = os.path.abspath(args.results or f"{scratch}-seed{args.seed}.jsonl")
    done = load_results(results_path)
    env = shared_env(repo, os.environ)
    cov, changed = load_coverage(args, repo, head, env)
    logs = os.path.join(scratch, ".mutate-logs")
    os.makedirs(logs, exist_ok=True)
    print(f"mutate: results {results_path}, logs {logs}")
    # A mutant that hangs a test is killed once Bazel times the test out;
    # a shorter limit than the size's (300 s for medium) spends less on it.
    test_flags = [f"--test_timeout={args.test_timeout}"] if args.test_timeout else []
    t0 = time.monotonic()
    rings_of = {}
    rows = []
    for m in drawn:
        old = reusable(done.get(m.name, []), head, repo, args.nearest_only)
        if old:
            rows.append(old)
            print(f"{old['verdict']:15} {'(earlier)':>8}  {m.describe()}", flush=True)
            continue
        if args.budget and time.monotonic() - t0 > args.budget * 60:
            print(f"mutate: budget of {args.budget:g} min spent; run again to go on")
            break
        if m.file not in rings_of:
            rings_of[m.file] = dependent_tests(scratch, m.file, env)
        rings, selected_by, why = rings_of[m.file], "rdeps", ""
        if cov is not None and rings:
            with open(os.path.join(scratch, m.file), encoding="utf-8") as f:
                rings, selected_by, why = covered_rings(cov, changed, m, rings, scratch, f.read())
        all_rings = rings
        if args.nearest_only:
            rings = rings[:1]
        if selected_by == "coverage" and not rings:
            # No test ran the line: nothing built, a survivor.
            verdict, took, ran = "survived (uncovered)", 0.0, []
        elif not rings:
            verdict, took, ran = "no tests", 0.0, []
        else:
            path = os.path.join(scratch, m.file)
            with open(path, encoding="utf-8") as f:
                original = f.read()
            verdict, took, ran = "survived", 0.0, []
            try:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(m.apply(original))
                log = os.path.join(logs, m.name.replace("/", "_").replace(":", "_") + ".log")
                for ring in rings:
                    ran += ring
                    status, t = bazel_test(scratch, ring, args.mutant_timeout, log, env,
                                           test_flags)
                    took += t
                    if status != "passed":
                        verdict = {"failed": "killed", "timeout": "killed (timeout)"}.get(
                            status, status)
                        break
                if verdict == "survived" and args.nearest_only and len(all_rings) > 1:
                    verdict = "survived (nearest)"
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)
        row = {"head": head, "seed": args.seed, "name": m.name, "file": m.file, "line": m.line,
               "op": m.op, "before": m.before, "after": m.after, "verdict": verdict,
               "seconds": round(took, 1), "tests": ran}
        if cov is not None:
            row["tests_selected_by"] = selected_by
            row["selection"] = why
        with open(results_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        mark = "  [equivalent]" if m.name in equivalents else ""
        print(f"{verdict:15} {took:6.0f} s  {m.describe()}{mark}", flush=True)

    if not args.keep_server:
        subprocess.run(["bazel/bazelw", "shutdown"], cwd=scratch, env=env, capture_output=True)
    print()
    for r in rows:
        if r["verdict"] not in ("killed", "killed (timeout)") and r["name"] not in equivalents:
            print(f"{r['verdict']}: [{r['name']}] {r['file']}:{r['line']} "
                  f"{r['before'].strip()!r} -> {r['after'].strip()!r}")
    print(f"mutate: {len(rows)} of {len(drawn)} run, seed {args.seed}, {head}, "
          f"{(time.monotonic() - t0) / 60:.1f} min this run; score per folder "
          "(killed / (killed + survived), equivalents excluded):")
    print("\n".join(score_lines(rows, equivalents)))
    open_ = [r for r in rows if r["name"] not in equivalents
             and not r["verdict"].startswith("killed") and r["verdict"] != "unbuildable"]
    return 1 if open_ or len(rows) < len(drawn) else 0


if __name__ == "__main__":
    sys.exit(main())
