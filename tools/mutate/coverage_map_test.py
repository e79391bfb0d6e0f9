"""Coverage-guided test selection (tools/mutate/coverage_map.py and
mutate.py --coverage) on fabricated coverage.dat files: the map from
lines to the tests that ran them, and for a mutant's line which tests run,
when it is a survivor without a build, and when the data cannot be
trusted and every dependent test runs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess

import pytest

import coverage_map as cm
import generate
import mutate

SOURCE = """\
#include "lib/x.hpp"
int f(int a) {
  if (a < 0)
    return -1;
  return a;
}
int g(int a) {
  return a +
         1;
}
constexpr int h(int a) {
  return a * 2;
}
"""


def doc(file, counts, functions=()):
    """One gcov JSON document with one file: counts {line: count}."""
    return {"format_version": "1", "current_working_directory": "/proc/self/cwd",
            "files": [{"file": file,
                       "functions": [{"start_line": s, "end_line": e, "name": n}
                                     for s, e, n in functions],
                       "lines": [{"line_number": n, "count": c, "branches": [],
                                  "unexecuted_block": c == 0}
                                 for n, c in sorted(counts.items())]}]}


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


FUNCS = [(2, 6, "f"), (7, 10, "g"), (11, 13, "h")]


@pytest.fixture
def fake(tmp_path):
    """A repository with lib/x.cpp and three C++ tests, and the testlogs of
    a coverage run: a_test ran f's lines 2, 3, 5 and h; b_test ran f's 2 to
    5 (through an absolute sandbox path); spawn_test forks, and ran
    nothing of x.cpp; line 4 and g's lines are executable, and only b ran
    line 4; nothing ran g. Line 1 and line 9 have no record."""
    repo, logs = str(tmp_path / "repo"), str(tmp_path / "testlogs")
    write(repo, "lib/x.cpp", SOURCE)
    write(repo, "lib/BUILD.bazel", "")
    write(repo, "test/BUILD.bazel", "")
    write(repo, "test/a_test.cpp", "int main() { return f(1); }\n")
    write(repo, "test/b_test.cpp", "int main() { return f(-1); }\n")
    write(repo, "test/spawn_test.cpp", '#include "test/process.hpp"\nint main() {}\n')
    write(repo, "test/process.hpp", "inline int run() { return fork(); }\n")
    # The tests' own objects are not instrumented: only a helper of theirs
    # (test/helpers.cpp) is in their data.
    write(repo, "test/helpers.cpp", "int helper() { return 1; }\n")
    a = [doc("lib/x.cpp", {2: 1, 3: 1, 4: 0, 5: 1, 8: 0, 12: 1}, FUNCS),
         doc("test/helpers.cpp", {1: 1}),
         doc("/usr/include/c++/12/vector", {10: 5})]
    b = [doc("/root/.cache/bazel/_bazel_root/x/sandbox/processwrapper-sandbox/3/execroot/"
             "blobpipe/lib/x.cpp", {2: 1, 3: 1, 4: 1, 5: 0, 8: 0}, FUNCS),
         doc("test/helpers.cpp", {1: 1}),
         doc("external/asio/asio/io_context.hpp", {3: 1})]
    s = [doc("lib/x.cpp", {2: 0, 3: 0, 4: 0, 5: 0, 8: 0}, FUNCS),
         doc("test/helpers.cpp", {1: 0})]
    for name, docs in (("a_test", a), ("b_test", b), ("spawn_test", s)):
        write(logs, f"test/{name}/coverage.dat",
              "".join(json.dumps(d) + "\n" for d in docs))
    return repo, logs


def select(cov, repo, first, last=None, rdeps=("//test:a_test", "//test:b_test"),
           changed=(), path="lib/x.cpp"):
    return cm.select(cov, path, first, last or first, list(rdeps), set(changed), repo)


def test_the_map_holds_each_line_and_the_tests_that_ran_it(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    assert cov.tests == {"//test:a_test", "//test:b_test", "//test:spawn_test"}
    assert cov.tests_of("lib/x.cpp", 3) == {"//test:a_test", "//test:b_test"}
    assert cov.tests_of("lib/x.cpp", 4) == {"//test:b_test"}
    assert cov.tests_of("lib/x.cpp", 5) == {"//test:a_test"}
    assert cov.tests_of("lib/x.cpp", 8) == set()
    assert ("lib/x.cpp", 8) in cov.executable and ("lib/x.cpp", 9) not in cov.executable
    # Absolute sandbox paths are repo-relative; system and external files left out.
    assert set(cov.files) == {"lib/x.cpp"}
    assert cov.files["lib/x.cpp"] == cov.tests
    assert cov.own_sources["//test:a_test"] == {"test/helpers.cpp"}


def test_only_the_tests_of_the_run_are_read(fake):
    repo, logs = fake
    cov = cm.load(logs, repo, only={"//test:a_test"})
    assert cov.tests == {"//test:a_test"}
    assert cov.tests_of("lib/x.cpp", 4) == set()


def test_paths_and_labels_are_normalised(tmp_path):
    assert cm.normalise("lib/pipeline/./consumer.cpp") == "lib/pipeline/consumer.cpp"
    assert cm.normalise("/x/sandbox/7/execroot/blobpipe/lib/a.cpp") == "lib/a.cpp"
    assert cm.normalise("/usr/include/c++/12/vector") is None
    assert cm.normalise("external/asio/asio.hpp") is None
    repo = str(tmp_path)
    write(repo, "python/BUILD.bazel", "")
    write(repo, "a/b/BUILD.bazel", "")
    assert cm.label_of("/t", "/t/python/test_codec/coverage.dat", repo) == "//python:test_codec"
    assert cm.label_of("/t", "/t/a/b/c/coverage.dat", repo) == "//a/b:c"


def test_a_line_some_tests_ran_runs_only_those(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    sel = select(cov, repo, 4)
    assert (sel.by, sel.tests) == ("coverage", ["//test:b_test"])
    sel = select(cov, repo, 5)
    assert (sel.by, sel.tests) == ("coverage", ["//test:a_test"])
    # Only among the dependent tests.
    assert select(cov, repo, 3, rdeps=["//test:a_test"]).tests == ["//test:a_test"]


def test_a_mutant_over_several_lines_runs_the_tests_of_any(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    sel = select(cov, repo, 4, 5)
    assert (sel.by, sel.tests) == ("coverage", ["//test:a_test", "//test:b_test"])


def test_an_executable_line_no_test_ran_is_uncovered(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    sel = select(cov, repo, 8)
    assert (sel.by, sel.tests) == ("uncovered", [])
    assert select(cov, repo, 8, 9).by == "uncovered"


def test_a_line_without_a_record_runs_every_dependent_test(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    for line in (1, 9):  # an include, the continuation of g's return
        sel = select(cov, repo, line)
        assert (sel.by, sel.tests) == ("rdeps", ["//test:a_test", "//test:b_test"])


def test_a_file_no_test_has_data_of_runs_every_dependent_test(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    write(repo, "lib/y.cpp", SOURCE)
    assert select(cov, repo, 3, path="lib/y.cpp").by == "rdeps"


def test_a_header_runs_every_dependent_test(fake):
    repo, logs = fake
    write(repo, "lib/x.hpp", SOURCE)
    write(logs, "test/a_test/coverage.dat", json.dumps(doc("lib/x.hpp", {8: 0, 3: 1})) + "\n")
    cov = cm.load(logs, repo)
    assert cov.tests_of("lib/x.hpp", 3) == {"//test:a_test"}
    assert select(cov, repo, 8, path="lib/x.hpp").by == "rdeps"
    assert select(cov, repo, 3, path="lib/x.hpp").by == "rdeps"


def test_a_constexpr_function_runs_every_dependent_test(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    assert select(cov, repo, 12).by == "rdeps"


def test_stale_coverage_runs_every_dependent_test(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    sel = select(cov, repo, 8, changed=["lib/x.cpp"])
    assert sel.by == "rdeps" and "the file changed" in sel.reason
    # Another file of the library: who calls what may have changed.
    assert select(cov, repo, 8, changed=["lib/other/y.cpp"]).by == "rdeps"
    assert select(cov, repo, 4, changed=["python/ext/a.cpp"]).by == "rdeps"
    # Docs, tools/mutate and the tests leave the library as it was.
    for same in (["docs/reliability.md"], ["tools/mutate/mutate.py"], ["test/c_test.cpp"]):
        assert select(cov, repo, 8, changed=same).by == "uncovered"


def test_a_test_changed_since_runs(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    sel = select(cov, repo, 4, changed=["test/a_test.cpp"])
    assert (sel.by, sel.tests) == ("coverage", ["//test:a_test", "//test:b_test"])
    # A helper in its data.
    sel = select(cov, repo, 4, changed=["test/helpers.cpp"])
    assert (sel.by, sel.tests) == ("coverage", ["//test:a_test", "//test:b_test"])
    sel = select(cov, repo, 8, changed=["test/a_test.cpp"])
    assert (sel.by, sel.tests) == ("coverage", ["//test:a_test"])


def test_a_dependent_test_without_coverage_runs(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    sel = select(cov, repo, 4, rdeps=["//test:a_test", "//test:b_test", "//test:new_test"])
    assert (sel.by, sel.tests) == ("coverage", ["//test:b_test", "//test:new_test"])
    sel = select(cov, repo, 8, rdeps=["//test:a_test", "//test:new_test"])
    assert (sel.by, sel.tests) == ("coverage", ["//test:new_test"])
    # One whose sources are known and start no process, but not run under coverage.
    write(repo, "python/BUILD.bazel", "")
    write(repo, "python/tests/test_p.py", "import os\n")
    assert not cm.opaque(cov, "//python:test_p", repo)
    sel = select(cov, repo, 8, rdeps=["//test:a_test", "//python:test_p"])
    assert (sel.by, sel.tests) == ("coverage", ["//python:test_p"])


def test_a_test_that_spawns_processes_always_runs(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    # spawn_test.cpp, not in its coverage data, includes test/process.hpp, which forks.
    assert cm.own_source_files(cov, "//test:spawn_test", repo) == [
        "test/helpers.cpp", "test/process.hpp", "test/spawn_test.cpp"]
    assert cm.opaque(cov, "//test:spawn_test", repo)
    assert not cm.opaque(cov, "//test:a_test", repo)
    rdeps = ["//test:a_test", "//test:b_test", "//test:spawn_test"]
    assert select(cov, repo, 4, rdeps=rdeps).tests == ["//test:b_test", "//test:spawn_test"]
    assert select(cov, repo, 8, rdeps=rdeps).tests == ["//test:spawn_test"]
    # A helper in the data that forks makes its tests opaque too.
    write(repo, "test/helpers.cpp", "int helper() { return fork(); }\n")
    assert cm.opaque(cov, "//test:a_test", repo)


def test_a_python_test_is_read_with_the_modules_it_imports(tmp_path):
    repo = str(tmp_path)
    write(repo, "python/BUILD.bazel", "")
    write(repo, "python/tests/test_a.py", "import os\nimport cases\n")
    write(repo, "python/tests/cases.py", "import subprocess\n")
    write(repo, "python/tests/test_b.py", "import os\n")
    cov = cm.CoverageMap({}, set(), {}, set(), {}, {})
    assert cm.main_source("//python:test_a", repo) == "python/tests/test_a.py"
    assert cm.own_source_files(cov, "//python:test_a", repo) == [
        "python/tests/cases.py", "python/tests/test_a.py"]
    assert cm.opaque(cov, "//python:test_a", repo)
    assert not cm.opaque(cov, "//python:test_b", repo)
    # A test whose sources are not known (a shell test's) always runs.
    assert cm.opaque(cov, "//test:some_sh_test", repo)


# ---------------------------------------------------------------- mutate.py

def mutant_at(line, before="x", after="y"):
    return generate.Mutant("lib/x.cpp", line, "flip", 0, 1, before, after, "lib/x.cpp:flip:0")


def test_the_run_narrows_the_rings_and_keeps_nearest_first(fake):
    repo, logs = fake
    cov = cm.load(logs, repo)
    rings = [["//test:a_test"], ["//test:b_test", "//test:c_test"]]
    got = mutate.covered_rings(cov, set(), mutant_at(4), rings, repo, SOURCE)
    assert got[:2] == ([["//test:b_test", "//test:c_test"]], "coverage")
    got = mutate.covered_rings(cov, set(), mutant_at(3), rings, repo, SOURCE)
    assert got[:2] == ([["//test:a_test"], ["//test:b_test", "//test:c_test"]], "coverage")
    # A line no test ran: no ring, nothing to build.
    assert mutate.covered_rings(cov, set(), mutant_at(8), [["//test:a_test"]], repo,
                                SOURCE)[:2] == ([], "coverage")
    # A line without a record: the rings as they were.
    assert mutate.covered_rings(cov, set(), mutant_at(9), rings, repo, SOURCE)[:2] == (
        rings, "rdeps")
    # A mutant over two lines: its `before` spans them.
    got = mutate.covered_rings(cov, set(), mutant_at(4, "a\nb"), [rings[0] + rings[1][:1]],
                               repo, SOURCE)
    assert got[:2] == ([["//test:a_test", "//test:b_test"]], "coverage")


def test_uncovered_survivors_count_as_survivors_and_apart():
    rows = [{"name": "a", "file": "lib/p/x.cpp", "verdict": "killed"},
            {"name": "b", "file": "lib/p/x.cpp", "verdict": "survived (uncovered)"},
            {"name": "c", "file": "lib/p/x.cpp", "verdict": "survived"}]
    line = mutate.score_lines(rows, {})[0]
    assert "33.3 %" in line and "survived   2 (uncovered   1)" in line


def test_the_coverage_commit_decides_what_is_stale(tmp_path, fake):
    _, logs = fake
    repo = str(tmp_path / "git")
    write(repo, "lib/x.cpp", SOURCE)
    write(repo, "lib/y.cpp", SOURCE)
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True,
                                    text=True).stdout.strip()
    run("init", "-q")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "x", "--allow-empty")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    first = run("rev-parse", "HEAD")
    write(repo, "lib/y.cpp", SOURCE + "// changed\n")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    head = run("rev-parse", "HEAD")
    write(logs, "coverage-source.json", json.dumps(
        {"commit": first, "dirty": ["lib/z.cpp"], "tests": ["//test:a_test"]}))
    args = argparse.Namespace(coverage=logs, coverage_commit=None)
    cov, changed = mutate.load_coverage(args, repo, head, {})
    assert changed == {"lib/y.cpp", "lib/z.cpp"}
    assert cov.tests == {"//test:a_test"}
    args = argparse.Namespace(coverage=logs, coverage_commit=head)
    assert mutate.load_coverage(args, repo, head, {})[1] == {"lib/z.cpp"}
    os.remove(os.path.join(logs, "coverage-source.json"))
    with pytest.raises(SystemExit):
        mutate.load_coverage(argparse.Namespace(coverage=logs, coverage_commit=None),
                             repo, head, {})
