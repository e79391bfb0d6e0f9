"""tools/mutate/generate.py — mutants made by operators from the sources
(docs/reliability.md "Generated mutants"), for tools/mutate/mutate.py
--generate. Pure text work, no Bazel: tools/mutate/generate_test.py tests
it on small snippets.

Each operator finds sites line by line in a copy of the source whose
comments and string literals are blanked (same length, so offsets hold), so
no operator fires inside a comment or a string:

  flip       a relational operator reversed: < and >, <= and >=, == and !=
  bound      a bound moved by one: < and <=, > and >=
  negate     a condition negated: if (c) -> if (!(c)); Python: if not (c):
  false      a condition made always false: if (c) -> if (false)
  delete     a statement deleted: a call, an assignment, an early return
             (`if (c) return e;` on one line or two)
  swap       two adjacent arguments of a call swapped, when both are plain
             names or both literals (the types are not known here: a swap
             that does not compile is reported unbuildable, outside the score)
  default    a returned value replaced by its type's default: return {};
             (co_return {}; for blobpipe's result<T>, which has none, a
             default T: a success; Python: return None). The type is the
             return type of the enclosing function defined at column 0;
             where there is none (a lambda's or an in-class body's return
             only), no mutant.

C++ `<` and `>` are taken as operators only with a space on each side, as
the project's formatting writes them (templates have none). A mutant's
name is its file, operator and a digest of the line before and after, so a
name survives edits elsewhere in the file (the equivalents list keys on it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re

OPERATORS = ("flip", "bound", "negate", "false", "delete", "swap", "default")
CPP_SUFFIXES = (".cpp", ".cc", ".hpp", ".h")
PY_SUFFIXES = (".py",)


@dataclasses.dataclass(frozen=True)
class Mutant:
    file: str       # path from the repository root
    line: int       # 1-based, of the first line changed
    op: str         # one of OPERATORS
    start: int      # offset in the file's text of the replaced span
    end: int        # offset one past it
    before: str     # text[start:end]
    after: str      # what replaces it
    name: str = ""  # file:op:digest, set by mutants_of

    def apply(self, text: str) -> str:
        """The file's text with this mutant in it. REQUIRES: `text` is the
        text the mutant was generated from."""
        if text[self.start:self.end] != self.before:
            raise ValueError(f"{self.name}: the source changed since the mutant was made")
        return text[:self.start] + self.after + text[self.end:]

    def describe(self) -> str:
        return f"{self.file}:{self.line} {self.op}: {self.before.strip()!r} -> {self.after.strip()!r}"


# ---------------------------------------------------------------- blanking

def blank_cpp(text: str) -> str:
    """`text` with comments and the insides of string and char literals
    replaced by spaces (newlines kept), so offsets and lines are unchanged."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [ch if ch == "\n" else " " for ch in text[i:j]]
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                i += 1
                continue
            close = ")" + m.group(1) + '"'
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out[i + 1:j] = [ch if ch == "\n" else " " for ch in text[i + 1:j]]
            i = j
        elif c in "\"'":
            # A digit separator (1'000) is not a char literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out[i + 1:j - 1] = " " * max(0, j - 1 - (i + 1))
            i = j
        else:
            i += 1
    return "".join(out)


def blank_py(text: str) -> str:
    """As blank_cpp for Python: # comments, and string literals (triple
    quoted ones included) blanked."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif c in "\"'":
            q = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else c
            j = i + len(q)
            while j < n and not text.startswith(q, j):
                if q == c and text[j] == "\n":
                    break
                j += 2 if text[j] == "\\" else 1
            j = min(j + len(q), n)
            inner = text[i + len(q):j - len(q)]
            out[i + len(q):j - len(q)] = [ch if ch == "\n" else " " for ch in inner]
            i = j
        else:
            i += 1
    return "".join(out)


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for m in re.finditer("\n", text):
        starts.append(m.end())
    return starts


def _matching(blank: str, open_at: int) -> int:
    """Offset of the bracket closing the one at `open_at`, or -1."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    depth, opener, closer = 0, blank[open_at], pairs[blank[open_at]]
    for j in range(open_at, len(blank)):
        if blank[j] == opener:
            depth += 1
        elif blank[j] == closer:
            depth -= 1
            if depth == 0:
                return j
    return -1


# ---------------------------------------------------------------- operators

FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "!=", "!=": "=="}
BOUND = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
# A relational operator between spaces; the lookarounds keep <<, >>, ->,
# <=> and the compound assignments out.
_REL = re.compile(r"(?<=\s)(<=|>=|==|!=|<|>)(?=\s)")


def _relational(path, text, blank, make):
    for m in _REL.finditer(blank):
        op = m.group(1)
        if op in ("<", ">") and path.endswith(CPP_SUFFIXES):
            # `template <` and `#include <` are not comparisons.
            line_start = blank.rfind("\n", 0, m.start()) + 1
            head = blank[line_start:m.start()].strip()
            if head.endswith("template") or head.startswith("#"):
                continue
        yield from make(m.start(), m.end(), op)


def op_flip(path, text, blank):
    def make(s, e, op):
        yield s, e, FLIP[op]
    yield from _relational(path, text, blank, make)


def op_bound(path, text, blank):
    def make(s, e, op):
        if op in BOUND:
            yield s, e, BOUND[op]
    yield from _relational(path, text, blank, make)


_CPP_IF = re.compile(r"\b(if|while)\s*\(")
_PY_IF = re.compile(r"^[ \t]*(if|elif|while)\s+(.+?):[ \t]*(?:$|\S)", re.M)


def _cpp_conditions(blank):
    """(start, end) of each if/while condition's text inside its parens."""
    for m in _CPP_IF.finditer(blank):
        if blank[m.end():m.end() + 9].startswith("constexpr"):
            continue
        open_at = m.end() - 1
        close = _matching(blank, open_at)
        if close < 0:
            continue
        cond = blank[open_at + 1:close]
        # An if with an init-statement (`if (auto x = f(); x)`) or a
        # declaration as its condition (`if (auto x = f())`): leave it.
        if ";" in cond or re.match(r"\s*(auto|const|[\w:]+\s*[&*]?\s+\w+\s*=[^=])", cond):
            continue
        yield open_at + 1, close


def _py_conditions(blank):
    for m in _PY_IF.finditer(blank):
        # Only a condition whose colon ends the line (no one-line bodies
        # with lambdas or slices to confuse the colon).
        line_end = blank.find("\n", m.start())
        line_end = len(blank) if line_end < 0 else line_end
        line = blank[m.start():line_end].rstrip()
        if not line.endswith(":"):
            continue
        s = m.start(2)
        e = m.start() + len(line) - 1
        yield s, e


def op_negate(path, text, blank):
    if path.endswith(PY_SUFFIXES):
        for s, e in _py_conditions(blank):
            yield s, e, "not (" + text[s:e] + ")"
    else:
        for s, e in _cpp_conditions(blank):
            yield s, e, "!(" + text[s:e] + ")"


def op_false(path, text, blank):
    if path.endswith(PY_SUFFIXES):
        for s, e in _py_conditions(blank):
            if text[s:e].strip() != "False":
                yield s, e, "False"
    else:
        for s, e in _cpp_conditions(blank):
            if text[s:e].strip() != "false":
                yield s, e, "false"


_ASSIGN_OP = r"(?:=|\+=|-=|\*=|/=|%=|\|=|&=|\^=|<<=|>>=)"
# One lvalue token (no space: `auto x = ...` is a declaration, not this).
_CPP_ASSIGN = re.compile(r"^[ \t]*[\w.\[\]>*-]+[ \t]*" + _ASSIGN_OP + r"[ \t]*[^=].*;[ \t]*$")
_CPP_INCDEC = re.compile(r"^[ \t]*(?:\+\+|--)?[\w.\[\]>*-]+(?:\+\+|--)?;[ \t]*$")
_CPP_CALL = re.compile(r"^[ \t]*(?:co_await\s+)?[\w:.>\[\]-]+(?:<[\w:, ]*>)?\(.*\);[ \t]*$")
_CPP_IF_RETURN = re.compile(r"^[ \t]*if \(.*\)\s+(?:co_)?return\b.*;[ \t]*$")
_CPP_IF_LINE = re.compile(r"^[ \t]*if \(.*\)[ \t]*$")
_CPP_RETURN_LINE = re.compile(r"^[ \t]*(?:co_)?return\b.*;[ \t]*$")
_KEYWORDS = ("return", "co_return", "if", "else", "for", "while", "switch", "case", "delete",
             "throw", "using", "typedef", "goto", "break", "continue", "static_assert")
_PY_ASSIGN = re.compile(r"^[ \t]*[\w.\[\]]+[ \t]*" + _ASSIGN_OP + r"[ \t]*[^=].*$")
_PY_CALL = re.compile(r"^[ \t]*[\w.]+\(.*\)[ \t]*$")


def _balanced(s: str) -> bool:
    return all(s.count(a) == s.count(b) for a, b in ("()", "[]", "{}"))


def op_delete(path, text, blank):
    starts = _line_starts(text)
    lines = blank.split("\n")
    py = path.endswith(PY_SUFFIXES)
    for k, line in enumerate(lines):
        s = starts[k]
        e = s + len(line)
        word = re.match(r"[ \t]*(\w*)", line).group(1)
        nxt = next((ln for ln in lines[k + 1:] if ln.strip()), "")
        if py:
            if word in ("return", "if", "elif", "else", "for", "while", "def", "class", "with",
                        "import", "from", "raise", "try", "except", "assert", "yield", "pass",
                        "global", "nonlocal", "lambda", "del") or not _balanced(line):
                continue
            if (_PY_ASSIGN.match(line) or _PY_CALL.match(line)) and not line.rstrip().endswith(":"):
                indent = re.match(r"[ \t]*", line).group(0)
                yield s, e, indent + "pass"
            continue
        if not _balanced(line):
            continue
        if _CPP_IF_RETURN.match(line) and not nxt.lstrip().startswith("else"):
            yield s, e, ""
        elif (k + 1 < len(lines) and _CPP_IF_LINE.match(line) and _balanced(line)
              and _CPP_RETURN_LINE.match(lines[k + 1])
              and not next((ln for ln in lines[k + 2:] if ln.strip()), "").lstrip().startswith("else")):
            yield s, starts[k + 1] + len(lines[k + 1]), ""
        elif word in _KEYWORDS:
            continue
        elif _CPP_ASSIGN.match(line) or _CPP_INCDEC.match(line) or _CPP_CALL.match(line):
            # The line before must end a statement or open a block: the
            # line is a whole statement, not the tail of one.
            prev = next((ln for ln in reversed(lines[:k]) if ln.strip()), "")
            if prev.rstrip().endswith((";", "{", "}", ":")) or not prev.strip():
                if _CPP_IF_LINE.match(prev) or re.match(r"^[ \t]*(else|for|while)\b", prev):
                    continue  # an unbraced body: deleting it changes the if's body
                yield s, e, ""


_SIMPLE_ARG = re.compile(r"^\s*(?:[A-Za-z_][\w]*(?:(?:\.|->|::)[A-Za-z_]\w*)*|-?\d+[uUlL]*)\s*$")


def _split_args(blank, open_at, close):
    """Top-level argument spans (start, end) of the call whose parens are
    at open_at and close."""
    spans, depth, start = [], 0, open_at + 1
    for j in range(open_at + 1, close):
        ch = blank[j]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((start, j))
            start = j + 1
    spans.append((start, close))
    return spans


_CALL_OPEN = re.compile(r"\b[A-Za-z_]\w*(?:<[\w:, ]*>)?\(")
_NOT_CALLS = {"if", "while", "for", "switch", "return", "sizeof", "alignof", "decltype",
              "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast", "catch",
              "static_assert", "co_return", "co_await", "noexcept", "def", "print", "elif",
              "assert", "not", "and", "or", "in", "lambda"}


def op_swap(path, text, blank):
    for m in _CALL_OPEN.finditer(blank):
        name = re.match(r"\w+", m.group(0)).group(0)
        if name in _NOT_CALLS:
            continue
        open_at = m.end() - 1
        close = _matching(blank, open_at)
        if close < 0:
            continue
        spans = _split_args(blank, open_at, close)
        for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
            a, b = text[s1:e1], text[s2:e2]
            if not (_SIMPLE_ARG.match(a) and _SIMPLE_ARG.match(b)):
                continue
            if a.strip() == b.strip() or "=" in a or "=" in b:
                continue
            digit = a.strip()[0].isdigit() or a.strip()[0] == "-"
            if digit != (b.strip()[0].isdigit() or b.strip()[0] == "-"):
                continue  # a name and a literal: rarely one type
            lead_a = a[:len(a) - len(a.lstrip())]
            lead_b = b[:len(b) - len(b.lstrip())]
            yield s1, e2, lead_a + b.strip() + "," + lead_b + a.strip()


_CPP_RET = re.compile(r"\b(co_return|return)\b(\s+)([^;]+);")
_PY_RET = re.compile(r"^([ \t]*)return\s+(\S.*?)[ \t]*$", re.M)


def op_default(path, text, blank):
    if path.endswith(PY_SUFFIXES):
        for m in _PY_RET.finditer(blank):
            if m.group(2).strip() == "None" or not _balanced(m.group(2)):
                continue
            yield m.start(2), m.end(2), "None"
        return
    for m in _CPP_RET.finditer(blank):
        value = m.group(3).strip()
        if value in ("{}", "true", "false", "0", "nullptr") or not _balanced(value):
            # true/false are flipped by negate; `return {}` is the default already.
            continue
        default = _cpp_default(_enclosing_return_type(blank, m.start()))
        if default is not None and value != default:
            yield m.start(3), m.end(3), default


# A function definition's head at column 0: its return type, then its name.
_FUNC_HEAD = re.compile(
    r"^(?:template\s*<[^\n]*>\s*)?(?:(?:static|inline|constexpr|\[\[nodiscard\]\])\s+)*"
    r"([A-Za-z_][\w:<>, *&]*?)\s+[*&]?[\w:~]+(?:<[^\n(]*>)?\(", re.M)


def _enclosing_return_type(blank, at):
    """The declared return type of the function defined at column 0 that
    encloses offset `at` (the last such head before it), or None."""
    head = None
    for m in _FUNC_HEAD.finditer(blank, 0, at):
        head = m
    return head.group(1).strip() if head else None


def _cpp_default(rtype):
    """What `return X;` becomes: `{}` (a value-initialized result), except
    that blobpipe's result<T> has no default, so its default is a
    default T, a success. None when the type is not known."""
    if rtype is None or rtype in ("auto", "void"):
        return None
    inner = rtype
    for wrapper in ("asio::awaitable<", "awaitable<"):
        if inner.startswith(wrapper) and inner.endswith(">"):
            inner = inner[len(wrapper):-1].strip()
    if inner.startswith("result<") and inner.endswith(">"):
        t = inner[len("result<"):-1].strip()
        return "{}" if t == "void" else t + "{}"
    return "{}"


OPERATOR_FUNCS = {"flip": op_flip, "bound": op_bound, "negate": op_negate, "false": op_false,
                  "delete": op_delete, "swap": op_swap, "default": op_default}


def mutants_of(path: str, text: str, ops=OPERATORS) -> list[Mutant]:
    """Every mutant the operators make of one file (`path` from the
    repository root, `text` its contents), in file order."""
    if path.endswith(PY_SUFFIXES):
        blank = blank_py(text)
    elif path.endswith(CPP_SUFFIXES):
        blank = blank_cpp(text)
    else:
        return []
    starts = _line_starts(text)
    found = []
    for op in ops:
        for s, e, after in OPERATOR_FUNCS[op](path, text, blank):
            before = text[s:e]
            if before == after:
                continue
            line = _bisect(starts, s) + 1
            found.append(Mutant(path, line, op, s, e, before, after))
    found.sort(key=lambda m: (m.start, OPERATORS.index(m.op), m.end))
    # The same change by two operators (e.g. a deleted line twice) once.
    seen, unique = set(), []
    for m in found:
        if (m.start, m.end, m.after) not in seen:
            seen.add((m.start, m.end, m.after))
            unique.append(m)
    # Named by the lines it changes, before and after, and which of the
    # identical changes in the file it is: edits elsewhere keep the name.
    count: dict[str, int] = {}
    named = []
    for m in unique:
        a, b = starts[m.line - 1], text.find("\n", m.end)
        b = len(text) if b < 0 else b
        lines_before = text[a:b]
        lines_after = text[a:m.start] + m.after + text[m.end:b]
        key = hashlib.sha256(f"{m.op}\0{lines_before.strip()}\0{lines_after.strip()}".encode())
        key = f"{path}:{m.op}:{key.hexdigest()[:8]}"
        k = count.get(key, 0)
        count[key] = k + 1
        named.append(dataclasses.replace(m, name=key if k == 0 else f"{key}.{k}"))
    return named


def _bisect(starts, offset):
    lo, hi = 0, len(starts)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid
    return lo


def sample(candidates: list[Mutant], n: int, seed: int) -> list[Mutant]:
    """`n` mutants drawn at random with `seed`, from candidates sorted by
    name first so the draw depends only on the sources, not on the order
    files were listed."""
    pool = sorted(candidates, key=lambda m: (m.file, m.start, m.name))
    rng = random.Random(seed)
    return rng.sample(pool, min(n, len(pool)))


# ---------------------------------------------------------------- equivalents

def parse_equivalents(path: str) -> dict[str, str]:
    """tools/mutate/equivalent.txt: blocks of
        [<mutant name>]
        mutant: <what it changes, for the reader>
        reason: <why no test can kill it>
    returns {name: reason}."""
    out, name, fields = {}, None, {}

    def finish(where):
        if name is None:
            return
        if not fields.get("reason", "").strip():
            raise ValueError(f"{path}:{where}: [{name}] has no reason")
        out[name] = fields["reason"]

    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if line.startswith("#") or not line.strip():
                continue
            m = re.fullmatch(r"\[(\S+)\]", line.strip())
            if m:
                finish(n)
                name, fields = m.group(1), {}
                if name in out:
                    raise ValueError(f"{path}:{n}: [{name}] listed twice")
                continue
            m = re.fullmatch(r"(mutant|reason): (.*)", line)
            if name is None or not m:
                raise ValueError(f"{path}:{n}: expected [name], mutant: or reason: {line}")
            fields[m.group(1)] = m.group(2)
    finish("end")
    return out
