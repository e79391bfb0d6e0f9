"""blobpipe as a drop-in for the reference module's whole surface: every
module-level name the reference documents, with its signature, returns
and built-in exception types; BlobPlan's fields,
buffers and keepalive; Entry as a frozen dataclass; every dtype the
reference accepts; and a storage client laying blobs out the way NeMo RL's
does, byte-identical to ``write``.

The reference itself cannot be committed. The cases that take the ``ref``
fixture run against it when ``BLOBPIPE_REFERENCE`` names its
``blob_format.py`` (with msgspec shimmed onto Debian's python3-msgpack when
missing). ``bazel/bazelw`` sets it to ``../shared/reference/blob_format.py``
beside the clone when that exists; another copy::

    BLOBPIPE_REFERENCE=/path/to/blob_format.py bazel/bazelw test //python:test_reference_surface

They skip, saying so, only when no reference is there; a path that names
no file fails them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import pickle
import struct
import sys
import types

import numpy as np
import pytest
import torch

import blobpipe as bf
from reference_shim import shim_msgspec


# ---------------------------------------------------------------- the reference (opt-in)

@pytest.fixture(scope="module")
def ref():
    path = os.environ.get("BLOBPIPE_REFERENCE")
    if not path:
        pytest.skip("no reference codec: BLOBPIPE_REFERENCE is unset and bazel/bazelw found "
                    "no ../shared/reference/blob_format.py beside the clone")
    assert os.path.isfile(path), f"BLOBPIPE_REFERENCE={path}: no such file"
    try:
        shim_msgspec()
    except ImportError as ex:
        pytest.skip(f"no msgspec and no python3-msgpack to shim it with ({ex})")
    spec = importlib.util.spec_from_file_location("reference_blob_format", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look themselves up there
    spec.loader.exec_module(mod)
    return mod


# The reference's documented module-level functions and their parameters.
REFERENCE_FUNCTIONS = {
    "_align_up": ["n"],
    "_tensor_bytes": ["t"],
    "_numpy_bytes": ["a"],
    "encode_value": ["key", "v"],
    "plan": ["keys", "values", "tag"],
    "write_tail": ["p", "out"],
    "write": ["p", "out"],
    "_torch_dtype": ["name"],
    "decode_entry": ["view", "e"],
    "materialize": ["v"],
    "_footer": ["blob"],
    "footer_tag": ["tail"],
    "read_index": ["blob"],
    "footer_is_valid": ["blob_tail"],
    "_entries": ["raw"],
}
REFERENCE_CONSTANTS = {
    "ALIGN": 64, "MAGIC": 0x4E564450, "VERSION": 3, "_FOOTER_FMT": "<IHHII16s",
    "FOOTER_SIZE": 32, "_FOOTER_V2_FMT": "<IHHII", "FOOTER_V2_SIZE": 16, "NO_TAG": bytes(16),
    "KIND_TENSOR": "t", "KIND_NUMPY": "n", "KIND_PICKLE": "p",
}


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("name", sorted(REFERENCE_FUNCTIONS))
def test_every_reference_function_exists_with_its_parameter_names(name):
    fn = getattr(bf, name)
    # blobpipe's extra parameters are keyword-only (allow_pickle).
    positional = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind != inspect.Parameter.KEYWORD_ONLY]
    assert positional == REFERENCE_FUNCTIONS[name]


@pytest.mark.parametrize("name", sorted(REFERENCE_CONSTANTS))
def test_every_reference_constant_has_its_value(name):
    assert getattr(bf, name) == REFERENCE_CONSTANTS[name]


def test_footer_formats_give_the_footer_sizes():
    assert struct.calcsize(bf._FOOTER_FMT) == bf.FOOTER_SIZE
    assert struct.calcsize(bf._FOOTER_V2_FMT) == bf.FOOTER_V2_SIZE


def test_reference_functions_are_called_by_keyword():
    p = bf.plan(keys=["a"], values=[np.arange(3)], tag=b"t")
    buf = bytearray(p.nbytes)
    bf.write(p=p, out=buf)
    e = bf.read_index(blob=buf)[0]
    got = bf.decode_entry(view=memoryview(buf)[e.off: e.off + e.len], e=e)
    assert got.tolist() == [0, 1, 2]
    assert bf.footer_is_valid(blob_tail=buf)
    assert bf.footer_tag(tail=buf) == b"t" + bytes(15)
    assert bf.materialize(v=got).tolist() == [0, 1, 2]


def test_reference_surface_matches_the_reference_module(ref):
    documented = {n for n, v in vars(ref).items()
                  if not n.startswith("__") and getattr(v, "__module__", ref.__name__) == ref.__name__
                  and not isinstance(v, types.ModuleType)}
    documented -= {"annotations", "Any", "Sequence", "dataclass"}
    missing = sorted(n for n in documented if not hasattr(bf, n))
    assert not missing
    for name in documented:
        theirs = getattr(ref, name)
        if inspect.isfunction(theirs):
            ours = [p.name for p in inspect.signature(getattr(bf, name)).parameters.values()
                    if p.kind != inspect.Parameter.KEYWORD_ONLY]
            assert ours == _params(theirs), name
        elif not isinstance(theirs, type):
            assert getattr(bf, name) == theirs, name


# ---------------------------------------------------------------- helpers

def test_align_up_rounds_to_the_next_multiple_of_64():
    got = [bf._align_up(n) for n in (0, 1, 63, 64, 65, 127, 128, 10**20 + 1)]
    assert got == [0, 64, 64, 64, 128, 128, 128, 100000000000000000064]


def test_tensor_bytes_views_a_contiguous_cpu_tensor_in_place():
    t = torch.arange(12, dtype=torch.float32).view(3, 4)
    mv, owner = bf._tensor_bytes(t)
    assert isinstance(mv, memoryview) and mv.format == "B" and mv.nbytes == 48
    assert np.frombuffer(mv, np.uint8).ctypes.data == t.data_ptr()
    assert owner.data_ptr() == t.data_ptr() and not mv.readonly


def test_tensor_bytes_copies_a_non_contiguous_tensor():
    t = torch.arange(12, dtype=torch.int64).view(3, 4).t()
    mv, owner = bf._tensor_bytes(t)
    assert owner.is_contiguous() and torch.equal(owner, t)
    assert bytes(mv) == t.contiguous().numpy().tobytes()
    assert np.frombuffer(mv, np.uint8).ctypes.data == owner.data_ptr() != t.data_ptr()


def test_tensor_bytes_of_an_empty_tensor_is_empty():
    mv, owner = bf._tensor_bytes(torch.zeros(0, 3))
    assert mv.nbytes == 0 and tuple(owner.shape) == (0, 3)


def test_tensor_bytes_refuses_a_conjugate_view_as_torch_does():
    with pytest.raises(RuntimeError):
        bf._tensor_bytes(torch.ones(2, dtype=torch.complex64).conj())


def test_numpy_bytes_views_a_contiguous_array_and_copies_others():
    a = np.arange(6, dtype=np.int16)
    mv, owner = bf._numpy_bytes(a)
    assert owner is a and np.shares_memory(np.frombuffer(mv, np.uint8), a)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    mv, owner = bf._numpy_bytes(b)
    assert owner.flags.c_contiguous and not np.shares_memory(owner, b)
    assert bytes(mv) == np.ascontiguousarray(b).tobytes()


def test_numpy_bytes_refuses_object_records_as_numpy_does():
    with pytest.raises(TypeError):
        bf._numpy_bytes(np.zeros(2, dtype=[("a", object)]))


def test_encode_value_gives_bytes_owner_kind_dtype_shape():
    t = torch.ones(2, 3, dtype=torch.bfloat16)
    mv, owner, kind, dtype, shape = bf.encode_value("k", t)
    assert (kind, dtype, shape, mv.nbytes) == ("t", "bfloat16", (2, 3), 12)
    a = np.ones(4, dtype=">i4")
    assert bf.encode_value("k", a)[2:] == ("n", ">i4", (4,))
    mv, owner, *rest = bf.encode_value("k", {"x": 1})
    assert rest == ["p", None, None] and owner == pickle.dumps({"x": 1}, pickle.HIGHEST_PROTOCOL)
    assert bytes(mv) == owner


def test_torch_dtype_takes_every_name_torch_has():
    assert bf._torch_dtype("float") is torch.float32
    assert bf._torch_dtype("chalf") is torch.complex32
    assert bf._torch_dtype("quint8") is torch.quint8
    with pytest.raises(ValueError):
        bf._torch_dtype("no_such_dtype")
    with pytest.raises(TypeError):
        bf._torch_dtype(3)


def test_footer_reads_v3_and_v2_and_refuses_junk():
    p = bf.plan(["a"], [np.arange(2)], tag=b"abc")
    buf = bytearray(p.nbytes)
    bf.write(p, buf)
    assert bf._footer(buf) == (p.index_off, len(p.index_bytes), b"abc" + bytes(13))
    v2 = bytes(buf[: p.nbytes - bf.FOOTER_SIZE]) + struct.pack(
        bf._FOOTER_V2_FMT, bf.MAGIC, 2, 0, p.index_off, len(p.index_bytes))
    assert bf._footer(v2) == (p.index_off, len(p.index_bytes), bf.NO_TAG)
    assert bf._footer(bytes(40)) is None and bf._footer(b"") is None


def test_entries_reads_index_bytes_and_decoded_rows():
    p = bf.plan(["a", "b"], [np.arange(2), "x"])
    assert bf._entries(p.index_bytes) == p.entries
    rows = [["a", 0, 16, "n", "<i8", [2]], ["b", 64, 5, "p", None, None]]
    assert bf._entries(rows) == [bf.Entry("a", 0, 16, "n", "<i8", (2,)),
                                 bf.Entry("b", 64, 5, "p", None, None)]
    with pytest.raises(bf.FormatError):
        bf._entries(b"\xc1")


# ---------------------------------------------------------------- Entry as a dataclass

def test_entry_is_a_frozen_dataclass():
    e = bf.Entry("k", 64, 24, "t", "float32", (2, 3))
    assert dataclasses.is_dataclass(bf.Entry) and dataclasses.is_dataclass(e)
    assert [f.name for f in dataclasses.fields(e)] == ["key", "off", "len", "kind", "dtype", "shape"]
    assert dataclasses.asdict(e) == {"key": "k", "off": 64, "len": 24, "kind": "t",
                                     "dtype": "float32", "shape": (2, 3)}
    assert dataclasses.astuple(e) == ("k", 64, 24, "t", "float32", (2, 3))
    r = dataclasses.replace(e, key="j", off=128)
    assert type(r) is bf.Entry and (r.key, r.off, r.len, r.shape) == ("j", 128, 24, (2, 3))
    with pytest.raises(AttributeError):
        e.key = "x"


def test_entry_matches_by_position_and_keyword():
    e = bf.Entry("k", 0, 8, "n", "<f4", (2,))
    match e:
        case bf.Entry(key, off, n, "n", dtype, (count,)):
            got = (key, off, n, dtype, count)
        case _:
            got = None
    assert got == ("k", 0, 8, "<f4", 2)
    match e:
        case bf.Entry(kind="t"):
            kw = "tensor"
        case bf.Entry(kind="n", shape=shape):
            kw = shape
    assert kw == (2,)


def test_entry_equality_and_hash_are_by_fields():
    a = bf.Entry("k", 0, 8, "p", None, None)
    b = bf.Entry("k", 0, 8, "p", None, None)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != dataclasses.replace(a, len=9)


ENTRY_MUTATIONS = {
    "assign-field": lambda e: setattr(e, "key", "x"),
    "assign-new": lambda e: setattr(e, "other", 1),
    "delete-field": lambda e: delattr(e, "off"),
}


def entry_mutation_error(m, how):
    with pytest.raises(AttributeError) as err:
        ENTRY_MUTATIONS[how](m.Entry("k", 0, 8, "n", "<f4", (2,)))
    return type(err.value), str(err.value)


@pytest.mark.parametrize("how", sorted(ENTRY_MUTATIONS))
def test_entry_is_frozen_with_the_dataclass_error(how):
    kind, message = entry_mutation_error(bf, how)
    assert kind is dataclasses.FrozenInstanceError, kind
    name = {"assign-field": "key", "assign-new": "other", "delete-field": "off"}[how]
    verb = "delete" if how == "delete-field" else "assign to"
    assert message == f"cannot {verb} field {name!r}", message


@pytest.mark.parametrize("how", sorted(ENTRY_MUTATIONS))
def test_entry_is_frozen_as_the_reference(ref, how):
    assert entry_mutation_error(bf, how) == entry_mutation_error(ref, how)


# Fields the reference's dataclass takes as they are and no blob index holds.
ANY_FIELDS = {
    "str-offset": ("k", "64", 8, "n", "<f4", (2,)),
    "list-shape": ("k", 0, 8, "n", "<f4", [2]),
    "two-char-kind": ("k", 0, 8, "tt", None, None),
    "bytes-key": (b"k", 0, 8, "p", None, None),
    "negative-len": ("k", 0, -1, "p", None, None),
    "bool-offset": ("k", True, 8, "p", None, None),
    "anything": (1, 2.5, None, 4, 5, (6.5, "x")),
    # One character, but not one byte of an index row's kind.
    "non-ascii-kind": ("k", 0, 8, "\u00e9", None, None),
    "offset-2-64": ("k", 1 << 64, 8, "p", None, None),
    "dim-2-63": ("k", 0, 8, "n", "<f4", (1 << 63,)),
    "bool-dim": ("k", 0, 8, "n", "<f4", (True,)),
    # A str UTF-8 cannot encode (a lone surrogate).
    "surrogate-key": ("\ud800", 0, 8, "p", None, None),
    "bytes-dtype": ("k", 0, 8, "n", b"<f4", (2,)),
}


def entry_behaviour(m, fields):
    """What the dataclass machinery and the Entry itself say about an Entry
    of ``fields``."""
    e = m.Entry(*fields)
    try:
        h = hash(e) == hash(m.Entry(*fields))
    except TypeError as ex:
        h = ("unhashable", str(ex))
    r = dataclasses.replace(e, off=0)
    return {
        "fields": tuple(getattr(e, f) for f in ("key", "off", "len", "kind", "dtype", "shape")),
        "types": tuple(type(getattr(e, f)) for f in ("key", "off", "len", "kind", "dtype", "shape")),
        "asdict": dataclasses.asdict(e), "astuple": dataclasses.astuple(e),
        "eq": e == m.Entry(*fields), "ne-tuple": e != tuple(fields), "hash": h,
        "repr": repr(e), "replaced": dataclasses.astuple(r), "pickled": pickle.loads(pickle.dumps(e)) == e,
        "meta": e.meta(), "match": match_fields(m, e),
    }


def match_fields(m, e):
    match e:
        case m.Entry(key, off, n, kind, dtype, shape):
            return (key, off, n, kind, dtype, shape)
    return None


@pytest.mark.parametrize("case", sorted(ANY_FIELDS))
def test_entry_takes_any_field_value_as_the_dataclass(case):
    fields = ANY_FIELDS[case]
    got = entry_behaviour(bf, fields)
    assert isinstance(bf.Entry(*fields), bf.Entry)
    assert got["fields"] == fields and got["types"] == tuple(type(f) for f in fields)
    assert got["eq"] and got["ne-tuple"] and got["pickled"] and got["match"] == fields
    assert got["repr"] == "Entry(" + ", ".join(
        f"{n}={v!r}" for n, v in zip(("key", "off", "len", "kind", "dtype", "shape"), fields)) + ")"
    if case in INDEX_LIKE:
        return  # decoded as the row they read as (the next test)
    # No index holds such a row: decoding it is refused (a ValueError),
    # saying so, rather than decoding what the native part holds.
    with pytest.raises(bf.FormatError) as err:
        bf.decode_entry(bytes(8), bf.Entry(*fields))
    assert err.value.category == "invalid_argument" and "no blob index holds the row" in str(err.value)


# Fields that read as a row a blob index holds (operator.index of each
# integer, a list shape as a tuple), as the reference's decode_entry reads them.
INDEX_LIKE = {"list-shape", "bool-offset", "bool-dim"}


def test_decode_entry_reads_numpy_integers_and_a_list_shape_as_the_reference():
    raw = np.arange(4, dtype="<f4").tobytes()
    row = bf.Entry("k", 0, 16, "n", "<f4", (4,))
    want = bf.decode_entry(raw, row)
    for e in (bf.Entry("k", np.int64(0), np.uint64(16), "n", "<f4", [4]),
              dataclasses.replace(row, off=np.int64(0)),
              dataclasses.replace(row, shape=[np.int32(4)])):
        assert type(e) is not bf.Entry  # kept as given, as the dataclass does
        np.testing.assert_array_equal(bf.decode_entry(raw, e), want)
    assert bf.decode_entry(raw[:8], bf.Entry("k", np.int64(0), 8, "n", "<f4", [2])).tolist() == [0.0, 1.0]


def test_entry_with_any_field_values_replaced_into_index_values_is_native_again():
    loose = bf.Entry("k", "64", 8, "n", "<f4", [2])
    fixed = dataclasses.replace(loose, off=64, shape=(2,))
    assert type(fixed) is bf.Entry and fixed == bf.Entry("k", 64, 8, "n", "<f4", (2,))
    assert loose != fixed and fixed != loose
    assert bf.decode_entry(np.float32([1, 2]).tobytes(), fixed).tolist() == [1, 2]
    with pytest.raises(TypeError, match="missing 4 required positional arguments"):
        bf.Entry("k", 0)


@pytest.mark.parametrize("case", sorted(ANY_FIELDS))
def test_entry_takes_any_field_value_as_the_reference(ref, case):
    ours, theirs = entry_behaviour(bf, ANY_FIELDS[case]), entry_behaviour(ref, ANY_FIELDS[case])
    assert ours == theirs


# Calls the dataclass's generated __init__ refuses: (args, kwargs, its message).
ENTRY_BAD_CALLS = {
    "no-arguments": ((), {}, "Entry.__init__() missing 6 required positional arguments: 'key', "
                     "'off', 'len', 'kind', 'dtype', and 'shape'"),
    "one-missing": (("k", 0, 8, "p", None), {},
                    "Entry.__init__() missing 1 required positional argument: 'shape'"),
    "two-missing": (("k", 0, 8, "p"), {},
                    "Entry.__init__() missing 2 required positional arguments: 'dtype' and 'shape'"),
    "keywords-missing": ((), {"key": "k", "off": 0, "len": 8, "kind": "p"},
                         "Entry.__init__() missing 2 required positional arguments: 'dtype' and "
                         "'shape'"),
    "seven": (("k", 0, 8, "p", None, None, 1), {},
              "Entry.__init__() takes 7 positional arguments but 8 were given"),
    "unknown-keyword": (("k", 0, 8, "p", None, None), {"other": 1},
                        "Entry.__init__() got an unexpected keyword argument 'other'"),
    "repeated": (("k", 0, 8, "p", None, None), {"key": "j"},
                 "Entry.__init__() got multiple values for argument 'key'"),
}


def entry_call_error(m, case):
    args, kwargs, _ = ENTRY_BAD_CALLS[case]
    with pytest.raises(TypeError) as err:
        m.Entry(*args, **kwargs)
    return type(err.value), str(err.value)


@pytest.mark.parametrize("case", sorted(ENTRY_BAD_CALLS))
def test_entry_refuses_bad_calls_with_the_dataclass_error(case):
    assert entry_call_error(bf, case) == (TypeError, ENTRY_BAD_CALLS[case][2])


@pytest.mark.parametrize("case", sorted(ENTRY_BAD_CALLS))
def test_entry_refuses_bad_calls_as_the_reference(ref, case):
    assert entry_call_error(bf, case) == entry_call_error(ref, case)


def test_entry_fields_by_keyword_in_any_order():
    e = bf.Entry(shape=(2,), dtype="<f4", kind="n", len=8, off=64, key="k")
    assert type(e) is bf.Entry and e == bf.Entry("k", 64, 8, "n", "<f4", (2,))
    assert bf.Entry("k", 64, 8, shape=(2,), dtype="<f4", kind="n") == e


def test_entry_pickled_by_new_then_setstate_is_filled_once():
    # The protocol of pickles whose Entry was made by __new__ alone, then
    # given its fields by __setstate__ (copyreg.__newobj__).
    bare = bf.Entry.__new__(bf.Entry)
    bare.__setstate__(("k", 64, 8, "n", "<f4", (2,)))
    assert bare == bf.Entry("k", 64, 8, "n", "<f4", (2,))
    with pytest.raises(TypeError, match="already holds its fields"):
        bare.__setstate__(("j", 0, 8, "p", None, None))
    assert bare.key == "k"  # immutable once filled
    with pytest.raises(TypeError, match="six fields"):
        bf.Entry.__new__(bf.Entry).__setstate__(["k", 64, 8, "n", "<f4", (2,)])
    with pytest.raises(TypeError, match="six fields"):
        bf.Entry.__new__(bf.Entry).__setstate__(("k", 64, 8, "n", "<f4"))
    with pytest.raises(bf.FormatError) as err:
        bf.Entry.__new__(bf.Entry).__setstate__(("k", "64", 8, "n", "<f4", (2,)))
    assert err.value.category == "invalid_argument"
    # A bare Entry holds a row no blob's bytes reach: decoding it is refused.
    with pytest.raises(bf.FormatError) as err:
        bf.decode_entries(bytes(64), [bf.Entry.__new__(bf.Entry)])
    assert err.value.category == "entry_out_of_range"


def test_entry_fits_is_the_native_entrys_rule():
    assert bf._blobpipe._entry_fits("k", 0, 8, "p", None, None)
    for case, fields in ANY_FIELDS.items():
        assert not bf._blobpipe._entry_fits(*fields), case
    with pytest.raises(TypeError):
        bf._blobpipe._entry_fits("k", 0, 8, "p", None)


def test_entries_from_c_are_entries_without_pybind11():
    # read_index, plan().entries, Entry.from_meta, Entry(...): one type,
    # weakly referenceable, no instance __dict__ (frozen).
    import weakref
    p = bf.plan(["a"], [np.arange(2)])
    buf = np.zeros(p.nbytes, np.uint8)
    bf.write(p, buf)
    for e in (bf.read_index(buf)[0], p.entries[0], bf.Entry.from_meta("a", p.entries[0].meta()),
              bf.Entry("a", 0, 16, "n", "<i8", (2,))):
        assert type(e) is bf.Entry and type(bf.Entry).__name__ == "type"
        assert weakref.ref(e)() is e and not hasattr(e, "__dict__")
        assert e == bf.Entry("a", 0, 16, "n", "<i8", (2,))


# ---------------------------------------------------------------- BlobPlan

@pytest.mark.parametrize("field", ["keys", "buffers", "keepalive", "entries", "index_bytes"])
def test_blob_plan_fields_are_no_class_attributes(field):
    # As the dataclass's fields without defaults: only instances have them
    # (built on first read for a plan from plan()).
    with pytest.raises(AttributeError, match=f"type object 'BlobPlan' has no attribute '{field}'"):
        getattr(bf.BlobPlan, field)
    p = bf.plan(["a"], [np.arange(2)])
    assert field not in p.__dict__ and getattr(p, field) is getattr(p, field)
    assert field in p.__dict__  # built once, then the instance's own


def test_blob_plan_is_a_dataclass_with_the_reference_fields_in_order():
    assert dataclasses.is_dataclass(bf.BlobPlan)
    assert [f.name for f in dataclasses.fields(bf.BlobPlan)] == [
        "keys", "buffers", "keepalive", "entries", "index_bytes", "nbytes", "tag"]


def _values():
    big = torch.arange(1 << 18, dtype=torch.float32)           # 1 MiB, contiguous
    strided = torch.arange(64, dtype=torch.int32).view(8, 8).t()  # non-contiguous
    arr = np.arange(100, dtype=np.float64)
    return ["big", "strided", "arr", "obj", "empty"], [big, strided, arr, {"r": 0.5},
                                                       torch.zeros(0)]


def test_plan_buffers_view_callers_memory_or_a_kept_copy():
    keys, values = _values()
    p = bf.plan(keys, values)
    assert len(p.buffers) == len(p.keepalive) == len(p.entries) == 5
    for e, mv in zip(p.entries, p.buffers):
        assert isinstance(mv, memoryview) and mv.format == "B" and mv.nbytes == e.len
    big, strided, arr, obj, _ = values
    assert np.frombuffer(p.buffers[0], np.uint8).ctypes.data == big.data_ptr()
    assert not p.buffers[0].readonly and p.buffers[0].c_contiguous
    # A non-contiguous value: a copy, owned by keepalive.
    assert p.keepalive[1].is_contiguous() and torch.equal(p.keepalive[1], strided)
    assert np.frombuffer(p.buffers[1], np.uint8).ctypes.data == p.keepalive[1].data_ptr()
    assert np.shares_memory(np.frombuffer(p.buffers[2], np.uint8), arr)
    assert p.keepalive[3] == bytes(p.buffers[3]) == pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    assert p.buffers[4].nbytes == 0
    assert p.index_off == p.nbytes - bf.FOOTER_SIZE - len(p.index_bytes)


def _written(p, fill=0xAB):
    buf = np.full(p.nbytes, fill, dtype=np.uint8)
    bf.write(p, buf)
    return buf.tobytes()


def test_blob_plan_built_by_a_caller_writes_the_same_blob():
    keys, values = _values()
    p = bf.plan(keys, values, tag=b"tag")
    q = bf.BlobPlan(p.keys, p.buffers, p.keepalive, p.entries, p.index_bytes, p.nbytes, p.tag)
    assert q == p
    assert _written(q) == _written(p)  # pads zeroed on both paths
    tail = len(p.index_bytes) + bf.FOOTER_SIZE
    a, b = bytearray(tail), bytearray(tail)
    bf.write_tail(p, a)
    bf.write_tail(q, b)
    assert a == b == _written(p)[p.index_off:]
    # A buffer one byte short is refused for either, naming what it needs.
    for plan in (p, q):
        with pytest.raises(bf.FormatError) as err:
            bf.write_tail(plan, bytearray(tail - 1))
        assert err.value.category == "buffer_too_small", plan
    # A strided `out` raises BufferTypeError naming it for either, a
    # read-only one for the caller's plan too (README "Python").
    from blobpipe._errors import BufferTypeError
    strided = memoryview(bytearray(2 * p.nbytes))[::2]
    for plan in (p, q):
        with pytest.raises(BufferTypeError, match="not C-contiguous"):
            bf.write(plan, strided)
    with pytest.raises(BufferTypeError, match="read-only"):
        bf.write(q, bytes(p.nbytes))


def test_assigning_a_plan_field_is_what_write_writes():
    p = bf.plan(["a"], [np.arange(3)])
    p.tag = b"new-tag".ljust(16, b"\0")
    assert bf.footer_tag(_written(p)) == p.tag


def test_a_callers_plan_with_a_wrong_buffer_length_is_refused():
    p = bf.plan(["a", "b"], [np.arange(3), np.arange(3)])
    q = dataclasses.replace(p, buffers=[p.buffers[0], memoryview(bytes(5))])
    out = bytearray(p.nbytes)
    with pytest.raises(bf.FormatError) as err:
        bf.write(q, out)
    assert err.value.category == "invalid_argument"
    assert out == bytearray(p.nbytes)  # not even the entry before it


def test_a_callers_plan_that_would_write_a_wrong_blob_is_refused():
    p = bf.plan(["a", "b"], [np.arange(8), np.arange(8)])
    a, b = p.entries
    cases = {
        "overlap": ([a, dataclasses.replace(b, off=a.off + 8)], p.buffers, "overlap"),
        "same range": ([a, dataclasses.replace(b, off=a.off)], p.buffers, "overlap"),
        "overlap listed last first": ([dataclasses.replace(b, off=a.off + 8), a], p.buffers[::-1],
                                      "overlap"),
        "a buffer missing": (p.entries, p.buffers[:1], "2 entries and 1 buffers"),
        "a buffer too many": (p.entries[:1], p.buffers, "1 entries and 2 buffers"),
    }
    for case, (entries, buffers, says) in cases.items():
        q = dataclasses.replace(p, entries=entries, buffers=buffers)
        out = bytearray(p.nbytes)
        with pytest.raises(bf.FormatError, match=says) as err:
            bf.write(q, out)
        assert err.value.category == "invalid_argument", case
        assert out == bytearray(p.nbytes), case  # nothing written
    # An offset that is no integer, and a strided buffer, fail before any
    # byte is written too.
    from blobpipe._errors import BufferTypeError
    for q, raised in ((dataclasses.replace(p, entries=[a, dataclasses.replace(b, off=float(b.off))]),
                       TypeError),
                      (dataclasses.replace(p, buffers=[p.buffers[0],
                                                       np.arange(16, dtype=np.int64)[::2]]),
                       BufferTypeError)):
        out = bytearray(p.nbytes)
        with pytest.raises(raised):
            bf.write(q, out)
        assert out == bytearray(p.nbytes)
    # A tag bytes() refuses, a size that is no integer and an entry that is
    # no Entry fail before any byte is written too, each a TypeError naming
    # what it is.
    for q, says in ((dataclasses.replace(p, tag="not bytes"), "tag: expected bytes"),
                    (dataclasses.replace(p, nbytes=float(p.nbytes)), "nbytes must be an integer"),
                    (dataclasses.replace(p, entries=[a, tuple(dataclasses.astuple(b))]),
                     r"entries\[1\] must be an Entry, not tuple")):
        for write in (bf.write, bf.write_tail):
            out = bytearray(p.nbytes)
            if write is bf.write_tail and "Entry" in says:
                continue  # write_tail() reads no entry
            with pytest.raises(TypeError, match=says):
                write(q, out)
            assert out == bytearray(p.nbytes)
    # A count as tag is the reference's zero tag, with nothing allocated
    # for it (bytes(2**40) would be a terabyte).
    assert _written(dataclasses.replace(p, tag=2**40)) == _written(p)
    # Entries apart in any order are written as listed.
    q = dataclasses.replace(p, entries=[b, a], buffers=p.buffers[::-1])
    assert _written(q) == _written(p)


def test_a_callers_plan_refuses_a_read_only_out_as_write_does():
    p = bf.plan(["a"], [np.arange(3)])
    q = dataclasses.replace(p)  # a caller's plan: written from its fields
    assert "_native" not in vars(q)
    for plan_ in (p, q):
        with pytest.raises(BufferError) as err:
            bf.write(plan_, memoryview(bytes(p.nbytes)))
        assert isinstance(err.value, TypeError)


# ---------------------------------------------------------------- dtypes

def _round_trip(values):
    p = bf.plan([str(i) for i in range(len(values))], values)
    buf = _written(p, 0)
    idx = bf.read_index(buf)
    mv = memoryview(buf)
    return buf, idx, [bf.decode_entry(mv[e.off: e.off + e.len], e) for e in idx]


def test_complex32_is_stored_and_decoded():
    t = torch.arange(3, dtype=torch.float16).to(torch.complex32)
    buf, (e,), (got,) = _round_trip([t])
    assert (e.dtype, e.len, e.shape) == ("complex32", 12, (3,))
    # Known bytes (the reference writes these for the same tensor).
    assert buf[:12].hex() == "00000000003c000000400000"
    assert bytes(buf[e.len:]).find(bytes.fromhex("9196a130000ca174a9636f6d706c657833329103")) >= 0
    assert got.dtype == torch.complex32 and torch.equal(got.view(torch.int32), t.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8, torch.qint32])
def test_quantized_tensors_store_their_integers(dtype):
    q = torch.quantize_per_tensor(torch.tensor([0.0, 0.1, 0.2, 0.5]), 0.1, 3, dtype)
    buf, (e,), (got,) = _round_trip([q])
    name = str(dtype).removeprefix("torch.")
    assert (e.kind, e.dtype, e.shape, e.len) == ("t", name, (4,), 4 * q.element_size())
    assert buf[:e.len] == q.int_repr().numpy().tobytes()
    # Scale and zero point are not in the blob: the integers come back raw.
    assert isinstance(got, bf.RawEntry) and got.tobytes() == q.int_repr().numpy().tobytes()


def test_packed_quantized_tensors_read_nothing_past_their_storage():
    q = torch.quantize_per_tensor(torch.arange(8.0) / 8, 0.1, 3, torch.quint4x2)
    buf, (e,), _ = _round_trip([q])
    packed = q.int_repr().numpy().tobytes()  # 4 bytes for 8 values
    assert (e.dtype, e.len) == ("quint4x2", 8)
    assert buf[:8] == packed + bytes(8 - len(packed))


def test_torch_dtype_aliases_are_read():
    e = bf.Entry("k", 0, 8, "t", "chalf", (2,))
    got = bf.decode_entry(bytes(8), e)
    assert got.dtype == torch.complex32 and tuple(got.shape) == (2,)


# ---------------------------------------------------------------- exception types

def test_from_meta_without_a_field_is_a_key_error():
    with pytest.raises(KeyError) as err:
        bf.Entry.from_meta("k", {"n": 1, "k": "t"})
    assert isinstance(err.value, bf.FormatError) and err.value.category == "malformed_index"


def test_from_meta_with_a_non_number_offset_is_a_type_error():
    with pytest.raises(TypeError) as err:
        bf.Entry.from_meta("k", {"o": None, "n": 1, "k": "t"})
    assert isinstance(err.value, bf.FormatError)
    with pytest.raises(ValueError):
        bf.Entry.from_meta("k", {"o": "x", "n": 1, "k": "t"})


def test_tensor_bytes_that_are_not_the_shape_are_a_runtime_error():
    e = bf.Entry("k", 0, 16, "t", "float32", (3,))
    with pytest.raises(RuntimeError) as err:
        bf.decode_entry(bytes(16), e)
    assert isinstance(err.value, bf.FormatError) and err.value.category == "shape_mismatch"
    # Not a whole number of elements: torch.frombuffer's ValueError.
    e = bf.Entry("k", 0, 6, "t", "float32", (2,))
    with pytest.raises(ValueError) as err:
        bf.decode_entry(bytes(6), e)
    assert not isinstance(err.value, RuntimeError)


def test_unparseable_numpy_dtype_is_a_type_error():
    with pytest.raises(TypeError) as err:
        bf.decode_entry(bytes(8), bf.Entry("k", 0, 8, "n", "no-such-dtype", (2,)))
    assert isinstance(err.value, bf.FormatError) and err.value.category == "unknown_dtype"


def test_sparse_csr_tensor_is_a_runtime_error():
    with pytest.raises(RuntimeError) as err:
        bf.plan(["csr"], [torch.eye(3).to_sparse_csr()])
    assert isinstance(err.value, bf.FormatError) and err.value.category == "invalid_argument"


def test_structured_array_with_objects_is_a_type_error():
    with pytest.raises(TypeError) as err:
        bf.plan(["a"], [np.zeros(2, dtype=[("a", object), ("b", np.int32)])])
    assert isinstance(err.value, bf.FormatError)


def test_read_only_or_strided_out_is_a_type_error():
    p = bf.plan(["a"], [np.arange(3)])
    for out in (memoryview(bytes(p.nbytes)), memoryview(bytearray(2 * p.nbytes))[::2]):
        with pytest.raises(TypeError) as err:
            bf.write(p, out)
        assert isinstance(err.value, BufferError)


def test_short_out_and_bad_blobs_are_value_errors():
    p = bf.plan(["a"], [np.arange(3)])
    with pytest.raises(ValueError):
        bf.write(p, bytearray(p.nbytes - 1))
    with pytest.raises(ValueError):
        bf.plan(["a", "b"], [1])
    for blob in (b"", bytes(64)):
        with pytest.raises(ValueError):
            bf.read_index(blob)


def _blob_with_index(index: bytes) -> bytes:
    """A blob of no entries whose index is the given msgpack bytes."""
    return index + struct.pack(bf._FOOTER_FMT, bf.MAGIC, bf.VERSION, 0, 0, len(index),
                               bf.NO_TAG)


# Malformed indexes (msgpack bytes, written out by hand) and the built-in the
# reference's `for k, o, n, kind, d, s in rows` / `tuple(s)` raises on them.
MALFORMED_INDEXES = {
    "root-int": (b"\x05", TypeError),                                # 5
    "row-int": (b"\x91\x05", TypeError),                            # [5]
    "row-of-5": (b"\x91\x95\xa1k\x00\x00\xa1p\xc0", ValueError),   # [["k",0,0,"p",None]]
    "shape-int": (b"\x91\x96\xa1k\x00\x00\xa1t\xa7float32\x05", TypeError),
    "bin-row": (b"\x91\xc4\x06" + bytes(6), TypeError),              # [b"\0" * 6]
    "short-row-first": (b"\x92\x91\x00\x05", ValueError),            # [[0], 5]
}


@pytest.mark.parametrize("case", sorted(MALFORMED_INDEXES))
def test_malformed_index_errors_are_the_references_built_ins(case):
    index, builtin = MALFORMED_INDEXES[case]
    with pytest.raises(bf.FormatError) as err:
        bf.read_index(_blob_with_index(index))
    assert err.value.category == "malformed_index"
    assert isinstance(err.value, builtin)
    if builtin is ValueError:
        assert not isinstance(err.value, TypeError)


@pytest.mark.parametrize("case", sorted(MALFORMED_INDEXES))
def test_malformed_index_errors_match_the_reference(ref, case):
    blob = memoryview(_blob_with_index(MALFORMED_INDEXES[case][0]))
    with pytest.raises(Exception) as theirs:
        ref.read_index(blob)
    with pytest.raises(bf.FormatError) as ours:
        bf.read_index(blob)
    builtin = next(c for c in type(theirs.value).__mro__ if c.__module__ == "builtins")
    assert isinstance(ours.value, builtin), (type(ours.value), type(theirs.value))


EXCEPTION_CASES = {
    "from_meta-missing": lambda m: m.Entry.from_meta("k", {"n": 1, "k": "t"}),
    "from_meta-None": lambda m: m.Entry.from_meta("k", {"o": None, "n": 1, "k": "t"}),
    "decode-torch-shape": lambda m: m.decode_entry(memoryview(bytes(16)),
                                                   m.Entry("k", 0, 16, "t", "float32", (3,))),
    "decode-torch-partial": lambda m: m.decode_entry(memoryview(bytes(6)),
                                                     m.Entry("k", 0, 6, "t", "float32", (2,))),
    "decode-numpy-dtype": lambda m: m.decode_entry(memoryview(bytes(8)),
                                                   m.Entry("k", 0, 8, "n", "no-such", (2,))),
    "decode-kind": lambda m: m.decode_entry(memoryview(bytes(8)),
                                            m.Entry("k", 0, 8, "x", None, None)),
    "plan-csr": lambda m: m.plan(["c"], [torch.eye(3).to_sparse_csr()]),
    "plan-conj": lambda m: m._tensor_bytes(torch.ones(2, dtype=torch.complex64).conj()),
    "plan-object-records": lambda m: m.plan(["a"], [np.zeros(2, dtype=[("a", object)])]),
    "plan-lengths": lambda m: m.plan(["a", "b"], [1]),
    "plan-tag": lambda m: m.plan(["a"], [1], tag=None),
    "write-read-only": lambda m: m.write(m.plan(["a"], [np.arange(3)]),
                                         memoryview(bytes(4096))),
    "write-short": lambda m: m.write(m.plan(["a"], [np.arange(3)]), memoryview(bytearray(8))),
    "read_index-small": lambda m: m.read_index(memoryview(b"")),
    "read_index-magic": lambda m: m.read_index(memoryview(bytes(64))),
    "torch_dtype": lambda m: m._torch_dtype("nope"),
}


@pytest.mark.parametrize("case", sorted(EXCEPTION_CASES))
def test_built_in_exception_types_are_the_references(ref, case):
    call = EXCEPTION_CASES[case]
    with pytest.raises(Exception) as theirs:
        call(ref)
    with pytest.raises(Exception) as ours:
        call(bf)
    builtin = next(c for c in type(theirs.value).__mro__ if c.__module__ == "builtins")
    assert isinstance(ours.value, builtin), (type(ours.value), builtin)


# ---------------------------------------------------------------- NeMo RL's storage client

def _backing_bytes(owner) -> int:
    """Size of the allocation a value lives in (what NeMo RL's client gates
    zero-copy on)."""
    if isinstance(owner, torch.Tensor):
        storage = owner.untyped_storage() if hasattr(owner, "untyped_storage") else owner._storage()
        return int(storage.nbytes())
    base = owner
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return int(getattr(base, "nbytes", 0) or 0)


def _store_blob(codec, keys, values, tag, zero_min=1 << 20, zero_max=32 << 20):
    """Lays a blob out without building it, as NeMo RL's storage client does:
    large tensor/array values (zero_min..zero_max bytes, in an allocation no
    larger, writable, C-contiguous) are sent from ``plan.buffers`` in
    place; the others are packed at ``_align_up`` offsets into one staging
    buffer, followed by ``write_tail``; every segment then lands at its blob
    offset in the store's memory. Returns (plan, the stored blob, how many
    values went zero-copy)."""
    p = codec.plan(keys, values, tag=tag)
    zero, packed = [], []
    for e, mv, owner in zip(p.entries, p.buffers, p.keepalive):
        if not e.len:
            continue
        if (e.kind in (codec.KIND_TENSOR, codec.KIND_NUMPY) and zero_min <= e.len <= zero_max
                and _backing_bytes(owner) <= zero_max and not mv.readonly and mv.c_contiguous):
            zero.append((e, mv))
        else:
            packed.append((e, mv))
    tail = len(p.index_bytes) + codec.FOOTER_SIZE
    layout, cur = [], 0
    for e, mv in packed:
        layout.append((e, mv, cur))
        cur = codec._align_up(cur + e.len)
    staging = np.zeros(cur + tail, dtype=np.uint8)
    segments = []  # (source bytes, blob offset)
    for e, mv, at in layout:
        staging[at: at + e.len] = np.frombuffer(mv.cast("B"), dtype=np.uint8)
        segments.append((staging[at: at + e.len], e.off))
    codec.write_tail(p, memoryview(staging)[cur: cur + tail])
    segments.append((staging[cur: cur + tail], p.index_off))
    for e, mv in zero:
        segments.append((np.frombuffer(mv.cast("B"), dtype=np.uint8), e.off))
    store = np.zeros(p.nbytes, dtype=np.uint8)  # the unit's memory
    for src, off in segments:
        store[off: off + src.nbytes] = src
    return p, store.tobytes(), len(zero)


def _client_values():
    g = torch.Generator().manual_seed(7)
    keys = ["ids", "logp", "mask", "big", "huge", "arr", "meta", "strided", "empty", "scalar"]
    values = [
        torch.randint(0, 50000, (2048,), generator=g),            # 16 KiB: packed
        torch.randn(1 << 18, generator=g),                          # 1 MiB: zero-copy
        torch.rand(2048, generator=g) > 0.5,                        # bool: packed
        torch.randn(3, 1 << 18, generator=g),                       # 3 MiB: zero-copy
        torch.randn(40 << 18, generator=g)[: 9 << 18],              # 9 MiB in 40 MiB: packed
        np.arange(1 << 18, dtype=np.float64),                       # 2 MiB array: zero-copy
        {"idx": 3, "reward": 0.5},                                  # pickled: packed
        torch.randn(1024, 1024, generator=g).t(),                   # strided: a 4 MiB copy
        torch.zeros(0, 4),
        torch.tensor(1.5),
    ]
    return keys, values


def test_storage_client_layout_gives_the_blob_write_gives():
    keys, values = _client_values()
    p, stored, zero = _store_blob(bf, keys, values, tag=bytes.fromhex("00" * 15 + "01"))
    assert zero == 4  # logp, big, arr and the strided copy went zero-copy
    assert stored == _written(p, 0)
    idx = bf.read_index(stored)
    got = bf.decode_entries(stored, idx)
    assert torch.equal(got[7], values[7]) and got[6] == values[6]


def test_storage_client_layout_is_byte_identical_to_the_references(ref):
    keys, values = _client_values()
    tag = bytes.fromhex("0123456789abcdef" * 2)
    _, ours, zero_ours = _store_blob(bf, keys, values, tag)
    _, theirs, zero_theirs = _store_blob(ref, keys, values, tag)
    assert zero_ours == zero_theirs
    assert ours == theirs


def test_plan_and_write_are_byte_identical_to_the_references(ref):
    keys, values = _client_values()
    values += [torch.arange(4, dtype=torch.float16).to(torch.complex32),
               torch.quantize_per_tensor(torch.arange(4.0) / 4, 0.1, 3, torch.qint32),
               np.zeros(3, dtype=">u2")]
    keys += ["c32", "q32", "be"]
    p, r = bf.plan(keys, values, b"x"), ref.plan(keys, values, b"x")
    assert p.index_bytes == r.index_bytes and p.nbytes == r.nbytes
    assert [bytes(b) for b in p.buffers] == [bytes(b) for b in r.buffers]
    theirs = bytearray(r.nbytes)  # the reference leaves pads as they were: zero them
    ref.write(r, memoryview(theirs))
    assert _written(p, 0) == bytes(theirs)
    assert [dataclasses.astuple(e) for e in bf.read_index(theirs)] == \
        [dataclasses.astuple(e) for e in ref.read_index(memoryview(theirs))]


@pytest.mark.parametrize("dtype", ["longdouble", "clongdouble"])
def test_numpy_long_double_is_stored_and_read_as_the_reference(ref, dtype):
    # dtype.str "<f16" / "<c32" here: the reference stores it as any other.
    a = (np.arange(6, dtype=getattr(np, dtype)) / 3).reshape(2, 3)
    p, r = bf.plan(["x"], [a]), ref.plan(["x"], [a])
    assert p.index_bytes == r.index_bytes and p.nbytes == r.nbytes
    theirs = bytearray(r.nbytes)
    ref.write(r, memoryview(theirs))
    ours = _written(p, 0)
    assert ours == bytes(theirs)
    (e,), (re,) = bf.read_index(theirs), ref.read_index(memoryview(ours))
    assert (e.kind, e.dtype, e.shape) == ("n", a.dtype.str, (2, 3))
    got = bf.decode_entry(memoryview(theirs)[e.off: e.off + e.len], e)
    back = ref.decode_entry(memoryview(ours)[re.off: re.off + re.len], re)
    assert got.dtype == a.dtype and np.array_equal(got, a)
    assert back.dtype == a.dtype and np.array_equal(back, a)


# ---------------------------------------------------------------- batched decode

def test_decode_entries_decodes_every_entry_as_decode_entry_does():
    values = [torch.arange(6).view(2, 3), np.arange(4, dtype=">i2"), {"a": [1]}, "s",
              torch.zeros(0, 2), torch.ones(2, dtype=torch.bfloat16)]
    p = bf.plan([str(i) for i in range(len(values))], values)
    buf = _written(p, 0)
    idx = bf.read_index(buf)
    mv = memoryview(buf)
    one = [bf.decode_entry(mv[e.off: e.off + e.len], e) for e in idx]
    many = bf.decode_entries(buf, idx)
    assert len(many) == len(one)
    for a, b in zip(many, one):
        assert type(a) is type(b)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b)
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        else:
            assert a == b
    raw = bf.decode_entries(buf, idx, allow_pickle=False)
    assert raw[2] == pickle.dumps({"a": [1]}, pickle.HIGHEST_PROTOCOL)


def test_decode_entries_splits_runs_of_like_entries_only_where_they_are_alike():
    # Runs of at least 4 like entries are decoded as one strided array; the
    # entries after each run differ in one thing only (shape, dtype, kind).
    values = ([torch.arange(4) + i for i in range(5)] + [torch.arange(4).view(2, 2)] * 4
              + [torch.arange(4, dtype=torch.float64)] * 4
              + [np.arange(4) + i for i in range(4)] + [np.arange(4).reshape(2, 2)]
              + [torch.ones(2, dtype=torch.bfloat16)] * 4)
    p = bf.plan([str(i) for i in range(len(values))], values)
    buf = _written(p, 0)
    idx = bf.read_index(buf)
    got = bf.decode_entries(buf, idx)
    for e, v, want in zip(idx, got, values):
        assert type(v) is type(want), e
        if isinstance(v, torch.Tensor):
            assert v.dtype == want.dtype and v.shape == want.shape and torch.equal(v, want), e
        else:
            assert v.dtype == want.dtype and v.shape == want.shape, e
            assert np.array_equal(v, want), e


def test_decode_entries_refuses_an_entry_past_the_blob():
    p = bf.plan(["a"], [np.arange(4)])
    buf = _written(p, 0)
    e = bf.read_index(buf)[0]
    with pytest.raises(bf.FormatError) as err:
        bf.decode_entries(buf[:16], [e])
    assert err.value.category == "entry_out_of_range"


def test_decode_entries_views_keep_the_blob_alive():
    p = bf.plan(["a"], [torch.arange(4.0)])
    buf = bytearray(p.nbytes)
    bf.write(p, buf)
    (t,) = bf.decode_entries(memoryview(buf), bf.read_index(buf))
    del buf
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
