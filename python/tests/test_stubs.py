"""The package's type stubs (``blobpipe/__init__.pyi``, shipped in the
package) against the module: every public name (``__all__``, the
reference's helpers, ``__version__``) has a stub entry, every stub entry is
such a name of the module, and each stubbed function takes the parameters
it takes at run time (names, kinds, which have defaults). mypy and
stubtest are not installed here: this is the part of stubtest's check
that needs neither."""

from __future__ import annotations

import ast
import inspect
import os

import pytest

import blobpipe as bf

STUB = os.path.join(os.path.dirname(bf.__file__), "__init__.pyi")

# The reference module's helpers that its callers use (README "Python").
HELPERS = {"_align_up", "_tensor_bytes", "_numpy_bytes", "_torch_dtype", "_footer", "_entries",
           "_FOOTER_FMT", "_FOOTER_V2_FMT"}


def stub_entries() -> dict[str, ast.AST]:
    """Top-level names the stub declares: functions, classes, annotated
    names, and re-exports (``from .m import X as X``)."""
    with open(STUB, encoding="utf-8") as f:
        tree = ast.parse(f.read(), STUB)
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            for a in node.names:
                if a.asname == a.name:  # the explicit re-export form
                    out[a.name] = node
    return out


def public_names() -> set[str]:
    return set(bf.__all__) | HELPERS | {"__version__"}


def test_the_stub_is_shipped_in_the_package():
    assert os.path.isfile(STUB), STUB
    assert os.path.isfile(os.path.join(os.path.dirname(STUB), "py.typed"))


def test_every_public_name_has_a_stub_entry():
    missing = public_names() - set(stub_entries())
    assert not missing, sorted(missing)


def test_every_stub_entry_is_a_public_name_of_the_module():
    entries = set(stub_entries())
    assert not entries - public_names(), sorted(entries - public_names())
    assert all(hasattr(bf, n) for n in entries), [n for n in entries if not hasattr(bf, n)]


def stub_parameters(node: ast.FunctionDef) -> list[tuple[str, str, bool]]:
    """(name, kind, has a default) per parameter, as inspect names kinds."""
    a = node.args
    out = []
    plain = a.posonlyargs + a.args
    first_default = len(plain) - len(a.defaults)
    for i, p in enumerate(plain):
        kind = "POSITIONAL_ONLY" if p in a.posonlyargs else "POSITIONAL_OR_KEYWORD"
        out.append((p.arg, kind, i >= first_default))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", False))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((p.arg, "KEYWORD_ONLY", d is not None))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", False))
    return out


STUB_FUNCTIONS = sorted(n for n, node in stub_entries().items() if isinstance(node, ast.FunctionDef))


def test_the_stub_types_the_codec_and_streaming_functions():
    assert {"plan", "write", "read_index", "decode_entry", "connect", "listen"} <= set(STUB_FUNCTIONS)


@pytest.mark.parametrize("name", STUB_FUNCTIONS)
def test_a_stubbed_function_takes_the_parameters_it_takes_at_run_time(name):
    got = stub_parameters(stub_entries()[name])
    sig = inspect.signature(getattr(bf, name))
    want = [(p.name, p.kind.name, p.default is not inspect.Parameter.empty)
            for p in sig.parameters.values()]
    assert got == want, (name, str(sig))
