"""The mutant generator's operators on small C++ and Python snippets
(tools/mutate/generate.py): each makes the change it names, at the sites
it should and nowhere else, and every C++ mutant of a snippet still
compiles."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

import generate as g


def changes(path, text, op):
    """[(before, after)] of every mutant `op` makes of `text`."""
    return [(m.before, m.after) for m in g.mutants_of(path, text, (op,))]


def mutated(path, text, op):
    return [m.apply(text) for m in g.mutants_of(path, text, (op,))]


# ---------------------------------------------------------------- blanking

def test_comments_and_strings_are_blanked_keeping_offsets():
    src = 'int a = 1; // x < y\nconst char* s = "a == b"; /* p != q\n */ char c = \'<\';\n'
    blank = g.blank_cpp(src)
    assert len(blank) == len(src) and blank.count("\n") == src.count("\n")
    for text in ("x < y", "a == b", "p != q", "'<'"):
        assert text not in blank
    assert "int a = 1;" in blank and "char c =" in blank


def test_a_digit_separator_is_not_a_char_literal():
    src = "constexpr int n = 1'000;\nif (a < b) f();\n"
    assert changes("x.cpp", src, "flip") == [("<", ">")]


def test_python_comments_and_strings_are_blanked():
    src = 'x = "a < b"  # c == d\ny = """\ne != f\n"""\nif p < q:\n    f()\n'
    assert changes("x.py", src, "flip") == [("<", ">")]


def test_no_operator_fires_inside_a_comment_or_string():
    src = ('// if (a < b) return x;\n'
           'const char* s = "if (a == b) f(x, y);";\n'
           '/* return 1; */\n')
    assert g.mutants_of("x.cpp", src) == []


# ---------------------------------------------------------------- relational

def test_flip_reverses_each_relational_operator():
    src = "bool f(int a, int b) { return a < b || a <= b || a > b || a >= b || a == b || a != b; }\n"
    assert changes("x.cpp", src, "flip") == [
        ("<", ">"), ("<=", ">="), (">", "<"), (">=", "<="), ("==", "!="), ("!=", "==")]


def test_bound_moves_each_inequality_by_one():
    src = "if (i < n && j <= m && k > 0 && l >= 1 && a == b) f();\n"
    assert changes("x.cpp", src, "bound") == [("<", "<="), ("<=", "<"), (">", ">="), (">=", ">")]


def test_templates_shifts_arrows_and_includes_are_not_comparisons():
    src = ("#include <vector>\n"
           "template <typename T>\n"
           "std::vector<int> v; auto x = a << 2; auto y = b >> 1; p->q = 1; auto z = a <=> b;\n"
           "x <<= 1;\n")
    assert changes("x.cpp", src, "flip") == []
    assert changes("x.cpp", src, "bound") == []


# ---------------------------------------------------------------- conditions

def test_negate_and_false_rewrite_if_and_while_conditions():
    src = "void f(int a) {\n  if (a > 1 && g(a)) h();\n  while (a--) h();\n}\n"
    assert changes("x.cpp", src, "negate") == [("a > 1 && g(a)", "!(a > 1 && g(a))"),
                                               ("a--", "!(a--)")]
    assert changes("x.cpp", src, "false") == [("a > 1 && g(a)", "false"), ("a--", "false")]


def test_conditions_with_declarations_and_if_constexpr_are_left():
    src = ("if constexpr (N > 1) f();\n"
           "if (auto r = g(); !r) return r;\n"
           "if (const auto* p = find(k)) use(p);\n")
    assert changes("x.cpp", src, "negate") == []
    assert changes("x.cpp", src, "false") == []


def test_python_conditions_are_negated_with_not():
    src = "def f(a):\n    if a < 1 or a > 9:\n        return 0\n    while a:\n        a -= 1\n"
    assert changes("x.py", src, "negate") == [("a < 1 or a > 9", "not (a < 1 or a > 9)"),
                                              ("a", "not (a)")]
    assert changes("x.py", src, "false") == [("a < 1 or a > 9", "False"), ("a", "False")]


# ---------------------------------------------------------------- delete

def test_delete_removes_calls_assignments_and_early_returns():
    src = ("int f(int& x, int n) {\n"
           "  g(x);\n"
           "  x = n + 1;\n"
           "  x += 2;\n"
           "  ++x;\n"
           "  if (n < 0) return -1;\n"
           "  if (n > 100)\n"
           "    return -2;\n"
           "  int y = n;\n"
           "  return x + y;\n"
           "}\n")
    assert changes("x.cpp", src, "delete") == [
        ("  g(x);", ""), ("  x = n + 1;", ""), ("  x += 2;", ""), ("  ++x;", ""),
        ("  if (n < 0) return -1;", ""), ("  if (n > 100)\n    return -2;", "")]


def test_delete_leaves_declarations_continuations_and_unbraced_bodies():
    src = ("void f(int n) {\n"
           "  auto r = g(n);\n"
           "  const int k = 3;\n"
           "  h(n,\n"
           "    k);\n"
           "  if (n)\n"
           "    g(n);\n"
           "  for (int i = 0; i < n; ++i)\n"
           "    g(i);\n"
           "  if (n < 0) return;\n"
           "  else g(1);\n"
           "}\n")
    assert changes("x.cpp", src, "delete") == []


def test_python_statements_are_deleted_as_pass():
    src = "def f(x):\n    g(x)\n    x.y = 2\n    return x\n"
    assert changes("x.py", src, "delete") == [("    g(x)", "    pass"), ("    x.y = 2", "    pass")]


# ---------------------------------------------------------------- swap

def test_swap_exchanges_adjacent_plain_arguments():
    src = "void f() { copy(dst, src, n); g(1, 2); h(a.b, c->d); }\n"
    assert [m.apply(src) for m in g.mutants_of("x.cpp", src, ("swap",))] == [
        "void f() { copy(src, dst, n); g(1, 2); h(a.b, c->d); }\n",
        "void f() { copy(dst, n, src); g(1, 2); h(a.b, c->d); }\n",
        "void f() { copy(dst, src, n); g(2, 1); h(a.b, c->d); }\n",
        "void f() { copy(dst, src, n); g(1, 2); h(c->d, a.b); }\n"]


def test_swap_leaves_names_beside_literals_equal_arguments_and_expressions():
    src = "void f() { g(a, 1); g(a, a); g(a + 1, b); if (a) g(x(1), y); }\n"
    assert changes("x.cpp", src, "swap") == []


# ---------------------------------------------------------------- default

def test_default_returns_the_types_default():
    src = ("int f(int a) { if (a) return a * 2; return {}; }\n"
           "void g() { return; }\n"
           "bool h() { return true; }\n"
           "task t() { co_return make(1); }\n")
    assert changes("x.cpp", src, "default") == [("a * 2", "{}"), ("make(1)", "{}")]


def test_default_of_a_result_is_a_default_value():
    src = ("result<blob_index> read(int a) {\n  if (a) return make_error(errc::io, \"x\");\n"
           "  return index;\n}\n"
           "result<void> check(int a) {\n  if (a) return make_error(errc::io, \"x\");\n"
           "  return ok();\n}\n"
           "asio::awaitable<result<std::size_t>> pump() {\n  co_return n;\n}\n"
           "static std::string name(int a) {\n  return \"x\";\n}\n")
    assert changes("x.cpp", src, "default") == [
        ('make_error(errc::io, "x")', "blob_index{}"), ("index", "blob_index{}"),
        ('make_error(errc::io, "x")', "{}"), ("ok()", "{}"), ("n", "std::size_t{}"),
        ('"x"', "{}")]


def test_no_default_without_a_known_return_type():
    src = "  auto f = [] { return 3 + x; };\nauto g() {\n  return 1 + y;\n}\n"
    assert changes("x.cpp", src, "default") == []


def test_python_default_is_none():
    src = "def f(a):\n    if a:\n        return a + 1\n    return None\n"
    assert changes("x.py", src, "default") == [("a + 1", "None")]


# ---------------------------------------------------------------- every C++ mutant compiles

SNIPPET = """\
#include <cstddef>
#include <cstring>
#include <vector>

namespace {

int clamp_len(int len, int limit) {
  if (len < 0) return -1;  // a comment: len < limit
  if (len > limit)
    return limit;
  return len;
}

const char* source = "if (a == b) return 1;";

std::size_t copy_some(std::vector<char>& out, std::size_t from, std::size_t n) {
  std::size_t done = 0;
  while (done < n && out.size() <= 64) {
    out.push_back(source[from + done]);
    ++done;
  }
  std::memmove(out.data(), out.data(), done);
  return done;
}

}  // namespace

int main() {
  std::vector<char> out;
  int a = clamp_len(3, 5);
  int b = 4;
  if (a == b || a != 2) a = b;
  return static_cast<int>(copy_some(out, 0, 5)) + a;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to compile the snippet with")
def test_every_cpp_mutant_of_a_snippet_compiles_and_differs():
    ms = g.mutants_of("snippet.cpp", SNIPPET)
    assert {m.op for m in ms} == set(g.OPERATORS)
    with tempfile.TemporaryDirectory() as d:
        for m in ms:
            text = m.apply(SNIPPET)
            assert text != SNIPPET
            path = os.path.join(d, "m.cpp")
            with open(path, "w") as f:
                f.write(text)
            r = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", path],
                               capture_output=True, text=True)
            assert r.returncode == 0, (m.describe(), r.stderr)


# ---------------------------------------------------------------- names, draws, equivalents

def test_names_are_unique_and_survive_edits_elsewhere():
    ms = g.mutants_of("snippet.cpp", SNIPPET)
    assert len({m.name for m in ms}) == len(ms)
    moved = g.mutants_of("snippet.cpp", "// a new first line\n\n" + SNIPPET)
    assert [m.name for m in moved] == [m.name for m in ms]
    assert [m.line for m in moved] == [m.line + 2 for m in ms]


def test_identical_changes_in_one_file_get_distinct_names():
    src = "void f() {\n  g(a, b);\n  g(a, b);\n}\n"
    names = [m.name for m in g.mutants_of("x.cpp", src, ("swap",))]
    assert len(names) == 2 and names[1] == names[0] + ".1"


def test_a_draw_is_fixed_by_its_seed_alone():
    ms = g.mutants_of("snippet.cpp", SNIPPET)
    a = g.sample(ms, 10, seed=3)
    assert [m.name for m in g.sample(list(reversed(ms)), 10, seed=3)] == [m.name for m in a]
    assert [m.name for m in g.sample(ms, 10, seed=4)] != [m.name for m in a]
    assert len(g.sample(ms, 10_000, seed=3)) == len(ms)


def test_apply_refuses_a_changed_source():
    m = g.mutants_of("x.cpp", "if (a < b) f();\n", ("flip",))[0]
    assert m.apply("if (a < b) f();\n") == "if (a > b) f();\n"
    with pytest.raises(ValueError):
        m.apply("if (a == b) f();\n")


def test_equivalents_need_a_reason_and_a_single_entry(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("# comment\n[a.cpp:flip:0123]\nmutant: a.cpp:3 '<' -> '>'\nreason: why\n")
    assert g.parse_equivalents(str(good)) == {"a.cpp:flip:0123": "why"}
    bad = tmp_path / "bad.txt"
    bad.write_text("[a.cpp:flip:0123]\nmutant: x\n")
    with pytest.raises(ValueError, match="no reason"):
        g.parse_equivalents(str(bad))
    twice = tmp_path / "twice.txt"
    twice.write_text("[n]\nreason: r\n[n]\nreason: r\n")
    with pytest.raises(ValueError, match="twice"):
        g.parse_equivalents(str(twice))


def test_the_projects_equivalents_list_parses():
    path = os.path.join(os.path.dirname(os.path.abspath(g.__file__)), "equivalent.txt")
    reasons = g.parse_equivalents(path)
    assert all(r.strip() for r in reasons.values())


# ---------------------------------------------------------------- the run's environment

def test_the_run_passes_the_golden_blobs_and_the_reference_beside_the_repository(tmp_path):
    import mutate
    repo = tmp_path / "blobpipe"
    repo.mkdir()
    (tmp_path / "shared" / "golden").mkdir(parents=True)
    (tmp_path / "shared" / "reference").mkdir()
    (tmp_path / "shared" / "reference" / "blob_format.py").write_text("")
    env = mutate.shared_env(str(repo), {"PATH": "/bin"})
    assert env["BLOBPIPE_GOLDEN_DIR"] == str(tmp_path / "shared" / "golden")
    assert env["BLOBPIPE_REFERENCE"] == str(tmp_path / "shared" / "reference" / "blob_format.py")
    assert env["PATH"] == "/bin"
    # A caller's own choice stands; with no ../shared nothing is added.
    mine = mutate.shared_env(str(repo), {"BLOBPIPE_REFERENCE": "/elsewhere.py"})
    assert mine["BLOBPIPE_REFERENCE"] == "/elsewhere.py"
    lone = tmp_path / "lone" / "blobpipe"
    lone.mkdir(parents=True)
    assert mutate.shared_env(str(lone), {}) == {}


# ---------------------------------------------------------------- a run's verdict

def summary(*rows):
    return "".join(f"//test:{name:<60} {status}\n" for name, status in rows)


def test_a_failing_test_is_a_kill_though_it_cut_the_others_short():
    import mutate
    # --notest_keep_going: the failure aborts the run (exit 1), and the
    # tests it stopped say NO STATUS.
    text = ("ERROR: test/BUILD.bazel:247:8: Testing //test:decoder_test failed: "
            "Test failed: aborting\n" +
            summary(("wire_vectors_test", "PASSED in 0.1s"),
                    ("decoder_test", "FAILED in 0.1s"),
                    ("server_test", "NO STATUS")) +
            "FAILED: Build did NOT complete successfully\n")
    assert mutate.test_verdict(1, text) == "failed"
    assert mutate.test_verdict(3, text) == "failed"
    timeout = summary(("decoder_test", "TIMEOUT in 60.0s"), ("server_test", "NO STATUS"))
    assert mutate.test_verdict(1, timeout) == "failed"


def test_a_target_that_does_not_build_is_never_a_kill():
    import mutate
    text = summary(("decoder_test", "FAILED TO BUILD"), ("wire_test", "FAILED in 0.1s"))
    assert mutate.test_verdict(1, text) == "unbuildable"
    # Nothing failed, yet tests never ran: the build stopped them.
    assert mutate.test_verdict(1, summary(("decoder_test", "NO STATUS"))) == "unbuildable"
    assert mutate.test_verdict(1, "ERROR: compile failed\n") == "unbuildable"


def test_passes_and_odd_exits_are_told_apart():
    import mutate
    assert mutate.test_verdict(0, summary(("decoder_test", "PASSED in 0.1s"))) == "passed"
    assert mutate.test_verdict(0, summary(("decoder_test", "(cached) PASSED in 0.1s"))) == "passed"
    assert mutate.test_verdict(3, "") == "failed"
    assert mutate.test_verdict(4, "") == "bazel exit 4"
