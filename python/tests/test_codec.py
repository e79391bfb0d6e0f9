"""The codec through the Python API: round trips of every dtype and shape,
non-contiguous values, pickles, buffers, tags, errors, and bad bytes that
must raise FormatError, never crash."""

from __future__ import annotations

import dataclasses
import gc
import io
import mmap
import pickle

import numpy as np
import pytest
import torch

import blobpipe as bf
from blob_cases import blob_bytes, cases

# The dtypes the reference writes (str(dtype) less "torch."); torch 1.13
# lacks the float8 and uint16/32/64 ones.
REFERENCE_TORCH_DTYPES = [
    "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64",
    "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "uint16", "uint32", "uint64",
]
TORCH_DTYPES = [n for n in REFERENCE_TORCH_DTYPES if isinstance(getattr(torch, n, None), torch.dtype)]
SHAPES = [(), (0,), (3,), (2, 0, 3), (2, 3, 4)]


def round_trip(keys, values, tag=bf.NO_TAG):
    """plan + write + read_index + decode_entry: (blob, entries, values)."""
    p = bf.plan(keys, values, tag)
    blob = np.zeros(p.nbytes, dtype=np.uint8)
    bf.write(p, blob)
    idx = bf.read_index(blob)
    assert idx == p.entries
    mv = memoryview(blob)
    return blob, idx, [bf.decode_entry(mv[e.off: e.off + e.len], e) for e in idx]


def make_tensor(dtype: torch.dtype, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    return (torch.randn(shape, generator=g) * 50).abs().to(dtype)


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


@pytest.mark.parametrize("dtype", ["int64", "bfloat16"])
def test_a_tensor_of_more_dims_than_numpy_has_round_trips(dtype):
    # The fresh-user review (2026-12-04): a 40-dim tensor planned and
    # written, then decoded, raised numpy's "maximum supported dimension
    # for an ndarray is 32" (a plain ValueError, no category); torch
    # takes up to 64 dims, format.md allows 64. decode_entry and
    # decode_entries both give the tensor back.
    t = make_tensor(getattr(torch, dtype), [2] + [1] * 38 + [3])
    blob, idx, (got,) = round_trip(["t"], [t])
    assert idx[0].shape == tuple(t.shape) and got.dim() == 40
    assert got.dtype == t.dtype and torch.equal(got, t)
    (again,) = bf.decode_entries(blob, idx)
    assert torch.equal(again, t)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_dtype_round_trip(dtype, shape):
    t = make_tensor(getattr(torch, dtype), shape)
    _, idx, (got,) = round_trip(["t"], [t])
    assert (idx[0].kind, idx[0].dtype, idx[0].shape) == ("t", dtype, shape)
    assert idx[0].len == t.numel() * t.element_size()
    assert isinstance(got, torch.Tensor) and got.dtype == t.dtype and tuple(got.shape) == shape
    assert tensor_bytes(got) == tensor_bytes(t)


def noncontiguous_tensors():
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    c = torch.randn(5, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))
    return {
        "transposed": base.t(),
        "step slice": base[:, ::2],
        "narrowed (storage offset)": base[1:3, 2:5],
        "expanded (stride 0)": torch.arange(3.0).expand(4, 3),
        "permuted 3-d": torch.arange(24).view(2, 3, 4).permute(2, 0, 1),
        "conjugate view": c.conj(),
        "negative view": c.conj().imag,
        "requires grad": torch.ones(3, requires_grad=True),
    }


@pytest.mark.parametrize("name", list(noncontiguous_tensors()))
def test_tensor_views_are_stored_as_their_values(name):
    t = noncontiguous_tensors()[name]
    _, idx, (got,) = round_trip(["t"], [t])
    assert idx[0].shape == tuple(t.shape)
    assert torch.equal(got, t.detach().resolve_conj().resolve_neg())
    # Same bytes as the reference, which stores t.contiguous().
    plain = t.detach().resolve_conj().resolve_neg().contiguous()
    assert bytes(round_trip(["t"], [t])[0]) == bytes(round_trip(["t"], [plain])[0])


NUMPY_DTYPES = ["<f4", ">f8", "<f2", "|i1", "|u1", "<i2", ">u2", "<i4", "<u4", "<i8", ">u8", "|b1",
                "<c8", ">c16", "<U3", "|S4", "<M8[ns]", "<m8[s]", ">i4", "<f8"]


def make_array(dtype: str, shape) -> np.ndarray:
    n = int(np.prod(shape))
    a = np.arange(n).astype(np.float64)
    if dtype[1] in "US":
        a = np.array([str(i % 1000) for i in range(n)])
    elif dtype[1] in "Mm":
        a = np.arange(n).astype("i8")
    return a.astype(dtype).reshape(shape)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_dtype_round_trip(dtype, shape):
    a = make_array(dtype, shape)
    _, idx, (got,) = round_trip(["a"], [a])
    assert (idx[0].kind, idx[0].dtype, idx[0].shape) == ("n", a.dtype.str, shape)
    assert got.dtype.str == a.dtype.str and got.shape == shape
    assert got.tobytes() == a.tobytes()


def noncontiguous_arrays():
    a = np.arange(24, dtype="<i4").reshape(4, 6)
    packed = np.zeros(4, dtype=np.dtype([("a", "i1"), ("b", "<i4")]))  # itemsize 5
    packed["b"] = [1, 2, 3, 4]
    aligned = np.zeros(3, dtype=[("x", "<f4"), ("y", "<f4")])
    aligned["y"] = [1.5, 2.5, 3.5]
    return {
        "transposed": a.T,
        "step slice": a[:, ::2],
        "reversed (negative stride)": a[::-1, ::-1],
        "big-endian view": a.astype(">i4")[::2],
        "record field, stride a whole number of items": aligned["y"],
        "record field, stride not a whole number of items": packed["b"],
        "broadcast (stride 0)": np.broadcast_to(np.arange(3.0), (4, 3)),
    }


@pytest.mark.parametrize("name", list(noncontiguous_arrays()))
def test_array_views_are_stored_as_their_values(name):
    a = noncontiguous_arrays()[name]
    _, idx, (got,) = round_trip(["a"], [a])
    assert idx[0].dtype == a.dtype.str and idx[0].shape == a.shape
    assert np.array_equal(got, a) and got.dtype == a.dtype
    assert bytes(round_trip(["a"], [a])[0]) == bytes(round_trip(["a"], [np.ascontiguousarray(a)])[0])


def test_structured_array_is_stored_as_raw_records():
    a = np.zeros(2, dtype=[("x", "<i4"), ("y", "<f4")])
    a["y"] = [0.5, 1.5]
    _, idx, (got,) = round_trip(["r"], [a])
    assert idx[0].dtype == "|V8"  # as the reference writes dtype.str
    assert got.tobytes() == a.tobytes()


PICKLED = {
    "int": 7, "float": 2.5, "str": "héllo", "bytes": b"\x00\x01", "none": None, "list": [1, "a", 2.0],
    "dict": {"k": 1, "v": [1, 2]}, "tuple": (1, 2), "bigint": 2 ** 70, "numpy scalar": np.float32(2.5),
    "object array": np.array([1, "a", None], dtype=object),
    "sparse COO tensor": torch.eye(3).to_sparse(),
}


@pytest.mark.parametrize("name", list(PICKLED))
def test_other_values_are_pickled_like_the_reference(name):
    v = PICKLED[name]
    blob, idx, (got,) = round_trip([name], [v])
    e = idx[0]
    assert (e.kind, e.dtype, e.shape) == ("p", None, None)
    assert blob[e.off: e.off + e.len].tobytes() == pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
    if isinstance(v, torch.Tensor):
        assert torch.equal(got.to_dense(), v.to_dense())
    elif isinstance(v, np.ndarray):
        assert got.tolist() == v.tolist()
    else:
        assert got == v and type(got) is type(v)
    raw = bf.decode_entry(blob[e.off: e.off + e.len], e, allow_pickle=False)
    assert raw == pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


def test_sparse_csr_tensor_is_refused():
    with pytest.raises(bf.FormatError) as err:
        bf.plan(["csr"], [torch.eye(3).to_sparse_csr()])
    assert err.value.category == "invalid_argument"


def test_cuda_tensor_is_copied_to_host():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (or a torch built without CUDA)")
    t = torch.arange(10, dtype=torch.float32, device="cuda")
    _, _, (got,) = round_trip(["t"], [t])
    assert torch.equal(got, t.cpu())


def test_raw_entries_round_trip_for_dtypes_torch_lacks():
    data = np.arange(8, dtype=np.uint8)
    f8 = bf.RawEntry("t", "float8_e4m3fn", (2, 4), data)
    u16 = bf.RawEntry("t", "uint16", (4,), data)
    _, idx, (got_f8, got_u16) = round_trip(["f8", "u16"], [f8, u16])
    assert [(e.kind, e.dtype, e.shape) for e in idx] == [
        ("t", "float8_e4m3fn", (2, 4)), ("t", "uint16", (4,))]
    if hasattr(torch, "float8_e4m3fn"):
        assert got_f8.dtype == torch.float8_e4m3fn
    else:
        assert got_f8 == f8
    if hasattr(torch, "uint16"):
        assert got_u16.dtype == torch.uint16
    else:  # numpy has the dtype torch lacks
        assert isinstance(got_u16, np.ndarray) and got_u16.dtype == np.uint16
        assert got_u16.tolist() == data.view("<u2").tolist()


def test_raw_entry_of_the_wrong_size_is_refused():
    with pytest.raises(bf.FormatError) as err:
        bf.plan(["x"], [bf.RawEntry("t", "uint16", (4,), np.zeros(7, np.uint8))])
    assert err.value.category == "invalid_argument"


def test_decoded_views_share_the_buffer_and_materialize_copies():
    p = bf.plan(["t", "n", "p"], [torch.zeros(4), np.zeros(4, "<i4"), [1]])
    buf = bytearray(p.nbytes)
    bf.write(p, buf)
    idx = bf.read_index(buf)
    mv = memoryview(buf)
    t, n, obj = (bf.decode_entry(mv[e.off: e.off + e.len], e) for e in idx)
    t_copy, n_copy, obj_copy = (bf.materialize(v) for v in (t, n, obj))
    buf[0:4] = np.float32(3.0).tobytes()
    buf[64:68] = np.int32(9).tobytes()
    assert t[0].item() == 3.0 and n[0] == 9  # views of buf
    assert t_copy[0].item() == 0.0 and n_copy[0] == 0  # copies
    assert obj_copy == [1]
    raw = bf.RawEntry("t", "bfloat16", (2,), np.frombuffer(buf, np.uint8, 4))
    raw_copy = bf.materialize(raw)
    buf[0] = 0x11
    assert raw.data[0] == 0x11 and raw_copy.data[0] != 0x11


def test_values_are_kept_alive_by_the_plan():
    p = bf.plan(["a", "b"], [torch.arange(1000), np.arange(1000)])  # the plan's references only
    gc.collect()
    out = bytearray(p.nbytes)
    bf.write(p, out)
    a, b = (bf.decode_entry(memoryview(out)[e.off: e.off + e.len], e) for e in bf.read_index(out))
    assert torch.equal(a, torch.arange(1000)) and np.array_equal(b, np.arange(1000))


@pytest.mark.parametrize("tag, expected", [
    (b"single", b"single" + bytes(10)),
    (bytes(range(16)), bytes(range(16))),
    (bytes(range(20)), bytes(range(16))),  # cut to 16, as the reference does
    (bytearray(b"ab"), b"ab" + bytes(14)),
    (memoryview(b"xyz"), b"xyz" + bytes(13)),
])
def test_tags_are_cut_or_padded_to_16_bytes(tag, expected):
    p = bf.plan(["x"], [1], tag=tag)
    assert p.tag == expected
    blob = bytearray(p.nbytes)
    bf.write(p, blob)
    assert bf.footer_tag(blob) == expected


def test_a_count_as_tag_is_the_zero_tag_and_allocates_nothing():
    # bytes(n) is n zero bytes: the reference's tag is zeros for any count.
    # A count of 2**40 is that tag too, with no terabyte allocated for it
    # (bytes(2**40) raises MemoryError here). A negative count is
    # bytes()'s ValueError, one past sys.maxsize its OverflowError.
    assert bf.plan(["x"], [1], tag=3).tag == bf.NO_TAG
    assert bf.plan(["x"], [1], tag=np.int64(2**40)).tag == bf.NO_TAG
    assert bf.plan(["x"], [1], tag=2**40).tag == bf.NO_TAG
    with pytest.raises(ValueError, match="negative count"):
        bf.plan(["x"], [1], tag=-1)
    with pytest.raises(OverflowError):
        bf.plan(["x"], [1], tag=2**63)

    # An object with __bytes__ is its bytes, even if it is an integer too.
    class Tagged(int):
        def __bytes__(self):
            return b"sample-7"

    assert bf.plan(["x"], [1], tag=Tagged(2**40)).tag == b"sample-7".ljust(16, b"\0")
    # An object whose __index__ raises TypeError (a numpy array of one or
    # more dims) is its buffer, as in bytes(); a 0-d integer array is a count.
    digest = bytes(range(1, 21))
    assert bf.plan(["x"], [1], tag=np.frombuffer(digest, np.uint8)).tag == digest[:16]
    assert bf.plan(["x"], [1], tag=np.array([3])).tag == bytes(np.array([3])).ljust(16, b"\0")
    assert bf.plan(["x"], [1], tag=np.array(3)).tag == bf.NO_TAG


def test_no_tag_reads_back_as_none():
    p = bf.plan([], [])
    blob = bytearray(p.nbytes)
    bf.write(p, blob)
    assert p.tag == bf.NO_TAG and bf.footer_tag(blob) is None and bf.read_index(blob) == []


def test_plan_fields_match_the_reference():
    p = bf.plan([1, "b"], [torch.ones(2), "x"], tag=b"t")
    assert p.keys == ["1", "b"]  # str(key), as the reference
    assert [e.key for e in p.entries] == ["1", "b"] and len(p) == 2
    assert p.index_off == p.nbytes - bf.FOOTER_SIZE - len(p.index_bytes)
    assert p.entries[1].off == bf.ALIGN  # the pickle of "x" follows at 64
    assert "2 entries" in repr(p)


@pytest.mark.parametrize("make_out", [
    bytearray, lambda n: memoryview(bytearray(n)), lambda n: np.zeros((n + 3) // 4, np.float32),
    lambda n: mmap.mmap(-1, n),
], ids=["bytearray", "memoryview", "float32 array", "mmap"])
def test_any_writable_buffer_takes_a_blob(make_out):
    p = bf.plan(["x", "y"], [torch.arange(5), {"a": 1}])
    out = make_out(p.nbytes)
    bf.write(p, out)
    blob = bytes(memoryview(out).cast("B")[: p.nbytes])
    for src in (blob, bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8)):
        assert bf.read_index(src) == p.entries


def test_write_refuses_read_only_and_short_buffers():
    p = bf.plan(["x"], [torch.arange(5)])
    with pytest.raises((BufferError, TypeError)):
        bf.write(p, bytes(p.nbytes))
    with pytest.raises(bf.FormatError) as err:
        bf.write(p, bytearray(p.nbytes - 1))
    assert err.value.category == "buffer_too_small"
    with pytest.raises(bf.FormatError) as err:
        bf.write_tail(p, bytearray(len(p.index_bytes)))
    assert err.value.category == "buffer_too_small"
    # A read-only or strided `out`, whatever its type, raises
    # BufferTypeError (README "Python"), numpy's ValueError for those too.
    from blobpipe._errors import BufferTypeError
    read_only = np.zeros(p.nbytes, np.uint8)
    read_only.flags.writeable = False
    for out in (bytes(p.nbytes), read_only, np.zeros((p.nbytes, 2), np.uint8)[:, 0],
                memoryview(bytearray(2 * p.nbytes))[::2]):
        with pytest.raises(BufferTypeError) as err:
            bf.write(p, out)
        assert isinstance(err.value, BufferError) and isinstance(err.value, TypeError)


def test_keys_and_values_must_pair_up():
    with pytest.raises(ValueError) as err:
        bf.plan(["a", "b"], [1])
    assert isinstance(err.value, bf.FormatError) and err.value.category == "invalid_argument"


def category_of(call) -> str:
    with pytest.raises(bf.FormatError) as err:
        call()
    return err.value.category


def test_decode_entry_checks_the_entry_against_its_bytes():
    def decode(n, kind, dtype, shape):
        return lambda: bf.decode_entry(bytes(n), bf.Entry("x", 0, 8, kind, dtype, shape))

    assert category_of(decode(4, "t", "float32", (2,))) == "entry_out_of_range"
    assert category_of(decode(8, "t", "float32", (3,))) == "shape_mismatch"
    assert category_of(decode(8, "q", None, None)) == "unknown_kind"
    assert category_of(decode(8, "t", "float128", (1,))) == "unknown_dtype"
    # The dataclass takes a kind of two characters; no index holds that row.
    assert category_of(lambda: bf.decode_entry(bytes(8), bf.Entry("x", 0, 8, "tt", None, None))) \
        == "invalid_argument"
    # A tensor row without dtype is float32, as in the reference.
    no_dtype = bf.Entry("x", 0, 8, "t", None, (2,))
    assert bf.decode_entry(np.float32([1, 2]).tobytes(), no_dtype).tolist() == [1, 2]


def test_decode_entry_of_a_wrong_length_view_raises_the_references_built_in_types():
    # The reference: torch's view(shape) raises RuntimeError, numpy's
    # reshape ValueError; blobpipe's FormatError is also that type.
    p = bf.plan(["t", "n"], [torch.arange(6, dtype=torch.float32), np.arange(6, dtype=np.int32)])
    blob = np.zeros(p.nbytes, np.uint8)
    bf.write(p, blob)
    t, n = bf.read_index(blob)
    for delta in (-4, 4):
        with pytest.raises(RuntimeError) as e:
            bf.decode_entry(memoryview(blob)[t.off:t.off + t.len + delta], t)
        assert isinstance(e.value, bf.FormatError) and e.value.category == "entry_out_of_range"
        with pytest.raises(ValueError) as e:
            bf.decode_entry(memoryview(blob)[n.off:n.off + n.len + delta], n)
        assert isinstance(e.value, bf.FormatError)


def test_read_index_of_a_non_contiguous_buffer_raises_type_error_as_the_reference():
    # The reference's memoryview.cast("B") raises TypeError; the buffer
    # protocol BufferError: the error is both.
    every_other_byte = memoryview(np.zeros((256, 2), np.uint8)[:, 0])
    with pytest.raises(TypeError) as e:
        bf.read_index(every_other_byte)
    assert isinstance(e.value, BufferError)


def test_every_codec_function_raises_buffer_type_error_for_a_strided_buffer():
    # One error for one mistake, and what the reference raises at each call:
    # a TypeError (memoryview.cast) or a BufferError (decode_entry's view).
    from blobpipe._errors import BufferTypeError
    p = bf.plan(["a"], [np.arange(4)])
    blob = np.zeros(p.nbytes, np.uint8)
    bf.write(p, blob)
    (e,) = bf.read_index(blob)
    # numpy refuses with a ValueError, a memoryview with a BufferError.
    by_numpy = np.zeros((p.nbytes, 2), np.uint8)[:, 0]
    by_numpy[:] = blob
    by_memoryview = memoryview(np.repeat(blob, 2))[::2]
    for strided in (by_numpy, by_memoryview):
        _every_codec_call_raises_buffer_type_error(p, e, strided, BufferTypeError)
    # A buffer refused for another reason keeps its own error: a released
    # memoryview's ValueError.
    released = memoryview(bytes(blob))
    released.release()
    released_out = memoryview(bytearray(p.nbytes))
    released_out.release()
    for call in (bf.read_index, bf.footer_is_valid, lambda b: bf.decode_entries(b, [e]),
                 lambda b: bf.write(p, released_out), lambda b: bf.write_tail(p, released_out)):
        with pytest.raises(ValueError, match="released") as err:
            call(released)
        assert not isinstance(err.value, BufferTypeError)


def _every_codec_call_raises_buffer_type_error(p, e, strided, BufferTypeError):
    meta = e.meta_msgpack()
    strided_meta = memoryview(bytes(b for c in meta for b in (c, 0)))[::2]
    calls = {
        "write": lambda: bf.write(p, strided),
        "write_tail": lambda: bf.write_tail(p, strided),
        "read_index": lambda: bf.read_index(strided),
        "footer_is_valid": lambda: bf.footer_is_valid(strided),
        "footer_tag": lambda: bf.footer_tag(strided[-bf.FOOTER_SIZE:]),
        "decode_entry": lambda: bf.decode_entry(strided[e.off:e.off + e.len], e),
        "decode_entries": lambda: bf.decode_entries(strided, [e]),
        "Entry.from_meta": lambda: bf.Entry.from_meta("a", strided_meta),
    }
    for name, call in calls.items():
        with pytest.raises(BufferTypeError, match="not C-contiguous") as err:
            call()
        assert isinstance(err.value, BufferError) and isinstance(err.value, TypeError), name


def test_a_crash_after_import_is_reported_by_pythons_faulthandler_not_ucx():
    # UCX's library constructor installs its own handler of SIGSEGV.
    import os
    import subprocess
    import sys
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("under ASan its own SIGSEGV handler reports the crash first")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("UCX_HANDLE_ERRORS", None)
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c",
                           "import blobpipe, ctypes; ctypes.string_at(0)"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr[-2000:]
    assert "Caught signal" not in done.stderr, done.stderr[-2000:]


def test_entry_signature_names_the_dataclass_fields():
    import inspect
    sig = inspect.signature(bf.Entry)
    assert list(sig.parameters) == ["key", "off", "len", "kind", "dtype", "shape"], str(sig)
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in sig.parameters.values())


def test_entry_behaves_like_the_reference_dataclass():
    e = bf.Entry(key="k", off=64, len=12, kind="t", dtype="int32", shape=(3,))
    assert (e.key, e.off, e.len, e.kind, e.dtype, e.shape) == ("k", 64, 12, "t", "int32", (3,))
    same = bf.Entry("k", 64, 12, "t", "int32", (3,))
    assert e == same and hash(e) == hash(same)
    # The dataclass keeps a list as given: a different, unhashable shape.
    assert e != bf.Entry("k", 64, 12, "t", "int32", [3])
    assert e != bf.Entry("k", 64, 12, "t", "int32", (4,)) and e != ("k", 64)
    # Another type is not compared (NotImplemented, as the dataclass): its
    # own __eq__ decides.
    assert e.__eq__(("k", 64)) is NotImplemented and e.__ne__(3) is NotImplemented

    class Anything:
        def __eq__(self, other):
            return True

    assert e == Anything() and not (e != Anything())
    assert repr(e) == "Entry(key='k', off=64, len=12, kind='t', dtype='int32', shape=(3,))"
    assert pickle.loads(pickle.dumps(e)) == e
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.off = 0  # frozen
    p = bf.Entry("p", 0, 5, "p", None, None)
    assert p.meta() == {"o": 0, "n": 5, "k": "p", "d": None, "s": []}
    assert bf.Entry.from_meta("p", p.meta()) == bf.Entry("p", 0, 5, "p", None, ())
    assert bf.Entry.from_meta("q", {"o": 1, "n": 2, "k": "t"}) == bf.Entry("q", 1, 2, "t", None, ())
    assert category_of(lambda: bf.Entry.from_meta("x", {"o": 0, "k": "t"})) == "malformed_index"
    assert category_of(lambda: bf.Entry.from_meta("x", {"o": "a", "n": 1, "k": "t"})) == "malformed_index"
    assert category_of(lambda: bf.Entry.from_meta("x", b"\xc1")) == "malformed_index"


def test_from_meta_refuses_what_no_index_row_holds():
    # A negative offset, a kind of two characters, a dtype that is not
    # UTF-8 (a msgpack meta map of the five fields, its dtype b"\xff\xfe").
    assert category_of(lambda: bf.Entry.from_meta("x", {"o": -1, "n": 1, "k": "t"})) \
        == "malformed_index"
    # A kind of two characters is unknown_kind, from a dict as from msgpack.
    with pytest.raises(bf.FormatError, match="^kind 'tt' is not t, n or p") as err:
        bf.Entry.from_meta("x", {"o": 0, "n": 1, "k": "tt"})
    assert err.value.category == "unknown_kind"
    meta = bytes.fromhex("85" "a16f00" "a16e08" "a16ba16e" "a164a2fffe" "a17390")
    with pytest.raises(bf.FormatError, match="not valid UTF-8") as err:
        bf.Entry.from_meta("x", meta)
    assert err.value.category == "malformed_index"
    ok = bytes.fromhex("85" "a16f00" "a16e08" "a16ba16e" "a164a33c6638" "a1739101")
    assert bf.Entry.from_meta("x", ok) == bf.Entry("x", 0, 8, "n", "<f8", (1,))


def test_a_numpy_dtype_numpy_cannot_make_arrays_of_comes_back_raw():
    got = bf.decode_entry(b"", bf.Entry("x", 0, 0, "n", "|V0", (0,)))
    assert isinstance(got, bf.RawEntry) and (got.dtype, got.shape, got.nbytes) == ("|V0", (0,), 0)


def test_a_tensor_whose_shape_raises_passes_the_error_on():
    class NoShape(torch.Tensor):
        @property
        def shape(self):
            raise ValueError("no shape here")

    with pytest.raises(ValueError, match="no shape here"):
        bf.plan(["a"], [torch.arange(3.0).as_subclass(NoShape)])


def test_plan_names_a_tag_that_is_no_bytes():
    # bytes(tag) raises TypeError for a str, as in the reference; the
    # message names the tag and what was given.
    with pytest.raises(TypeError, match=r"tag: expected bytes .* not str"):
        bf.plan(["a"], [1], tag="abc")

    # A tag's own error, a TypeError subclass included, passes on as it is.
    class Refused(TypeError):
        pass

    class Tag:
        def __bytes__(self):
            raise Refused("no bytes for you")

    with pytest.raises(Refused, match="no bytes for you"):
        bf.plan(["a"], [1], tag=Tag())
    assert bf.plan(["a"], [1], tag=bytearray(b"t")).tag == b"t".ljust(16, b"\0")


class _NoTruth:
    def __bool__(self):
        raise ZeroDivisionError("no truth here")


def test_a_callers_object_whose_protocol_raises_passes_its_error_on():
    # Each is a CPython call failing inside the extension: the caller's
    # own exception comes out, never a SystemError or a crash.
    p = bf.plan(["a"], [b"xy"])
    blob = bytearray(p.nbytes)
    bf.write(p, blob)
    (e,) = bf.read_index(blob)
    with pytest.raises(ZeroDivisionError, match="no truth here"):
        bf.decode_entry(memoryview(blob)[e.off:e.off + e.len], e, allow_pickle=_NoTruth())
    with pytest.raises(TypeError, match="entries must be a sequence of Entry"):
        bf.decode_entries(blob, 5)
    with pytest.raises(TypeError, match="missing required argument 'm'"):
        bf.Entry.from_meta("k")

    class NoIndex:
        def __index__(self):
            raise ZeroDivisionError("no index here")

    with pytest.raises(ZeroDivisionError, match="no index here"):
        bf.Entry.from_meta("k", {"o": 0, "n": 8, "k": "n", "d": "<i4", "s": [NoIndex()]})
    # A shape element that is no integer is a malformed index, as before.
    with pytest.raises(bf.FormatError) as err:
        bf.Entry.from_meta("k", {"o": 0, "n": 8, "k": "n", "d": "<i4", "s": ["x"]})
    assert err.value.category == "malformed_index"

    class ContiguityUnknown(torch.Tensor):
        def is_contiguous(self, *args, **kwargs):
            return _NoTruth()

    class ShapeOfText(torch.Tensor):
        @property
        def shape(self):
            return ("x",)

    class AddressOfText(torch.Tensor):
        def data_ptr(self):
            return "x"

    cases = {ContiguityUnknown: (ZeroDivisionError, "no truth here"),
             ShapeOfText: (TypeError, "cannot be interpreted as an integer"),
             AddressOfText: (TypeError, "an integer is required")}
    for cls, (raised, says) in cases.items():
        with pytest.raises(raised, match=says):
            bf.plan(["a"], [torch.arange(3.0).as_subclass(cls)])


def test_read_index_file_errors():
    with pytest.raises(bf.FileError) as err:
        bf.read_index_file("/nonexistent/blob")
    assert err.value.category == "io" and isinstance(err.value, OSError)
    with pytest.raises(bf.FileError):
        bf.read_index_file("/")
    blob = blob_bytes("single_f32.blob")
    with pytest.raises(TypeError):
        bf.read_index_file(io.StringIO("text"))

    class Broken(io.BytesIO):
        def read(self, n=-1):
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        bf.read_index_file(Broken(blob))
    assert category_of(lambda: bf.read_index_file(io.BytesIO(blob), 0, len(blob) + 1)) == "too_small"
    # off and nbytes: integers (numpy's too) in [0, 2**64), else a
    # TypeError or ValueError naming the argument.
    assert bf.read_index_file(io.BytesIO(blob), np.int64(0), np.uint64(len(blob)))
    for off, nbytes, raised, says in ((object(), 0, TypeError, "off must be an integer"),
                                      (0, 1.5, TypeError, "nbytes must be an integer"),
                                      (True, 0, TypeError, "off must be an integer"),
                                      (0, np.True_, TypeError, "nbytes must be an integer"),
                                      (-1, 0, ValueError, "off must be within"),
                                      (0, 2**64, ValueError, "nbytes must be within")):
        with pytest.raises(raised, match=f"read_index_file: {says}"):
            bf.read_index_file(io.BytesIO(blob), off, nbytes)


SMALL_VALID = [c for c in cases(valid=True) if c["nbytes"] <= 4096 and c["footer_version"] == 3]


@pytest.mark.parametrize("c", SMALL_VALID, ids=[c["name"] for c in SMALL_VALID])
def test_damaged_blobs_raise_format_errors_only(c):
    """Every byte set to 0x00 and to 0xff in turn, and every truncation:
    each read either succeeds or raises FormatError; so does decoding each
    entry it then lists (pickles as bytes: unpickling damage is pickle's)."""
    good = blob_bytes(c["file"])
    variants = [good[:n] for n in range(len(good))]
    for i in range(len(good)):
        for b in (0x00, 0xFF):
            variants.append(good[:i] + bytes([b]) + good[i + 1:])
    for blob in variants:
        try:
            idx = bf.read_index(blob)
        except bf.FormatError:
            continue
        for e in idx:
            try:
                bf.decode_entry(blob[e.off: e.off + e.len], e, allow_pickle=False)
            except bf.FormatError:
                pass


def test_type_stubs_name_what_the_extension_has():
    import ast
    from pathlib import Path

    from blobpipe import _blobpipe

    stub = ast.parse((Path(bf.__file__).parent / "_blobpipe.pyi").read_text())
    names = set()
    for node in stub.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    public = {n for n in dir(_blobpipe) if not n.startswith("_")}
    assert {n for n in names if not n.startswith("_")} == public
    # The private functions _stream.py calls are typed too, and exist.
    assert {n for n in names if n.startswith("_")} <= set(dir(_blobpipe))
    assert set(bf.__all__) <= set(dir(bf))


def _blob_and_entry():
    p = bf.plan(["a"], [np.zeros(3)])
    buf = bytearray(p.nbytes)
    bf.write(p, buf)
    return p, buf, bf.read_index(buf)[0]


@pytest.mark.parametrize("call", [
    lambda p, buf, e: bf.plan(None, []),
    lambda p, buf, e: bf.plan(["a"], 5),
    lambda p, buf, e: bf.plan(["a"], [1], tag=None),
    lambda p, buf, e: bf.write(None, buf),
    lambda p, buf, e: bf.write(p, None),
    lambda p, buf, e: bf.write_tail(p, "x"),
    lambda p, buf, e: bf.read_index(None),
    lambda p, buf, e: bf.read_index_file(None),
    lambda p, buf, e: bf.read_index_file(5),
    lambda p, buf, e: bf.read_index_file(object()),
    lambda p, buf, e: bf.read_index_file("/dev/null", "0"),
    lambda p, buf, e: bf.decode_entry(None, e),
    lambda p, buf, e: bf.decode_entry(memoryview(buf)[0:24], None),
    lambda p, buf, e: bf.decode_entry(memoryview(buf)[0:24], e.meta()),
    lambda p, buf, e: bf.Entry.from_meta("k", None),
    # (Entry("k", "0", ...) is no TypeError: the dataclass takes any value.)
    lambda p, buf, e: bf.Entry("k", 0),
    lambda p, buf, e: bf.footer_is_valid(None),
    lambda p, buf, e: bf.footer_tag(3),
], ids=["plan-keys", "plan-values", "plan-tag", "write-plan", "write-out", "write_tail-out",
        "read_index", "read_index_file-None", "read_index_file-int", "read_index_file-object",
        "read_index_file-off", "decode_entry-view", "decode_entry-None", "decode_entry-dict",
        "from_meta", "Entry", "footer_is_valid", "footer_tag"])
def test_wrong_typed_arguments_raise_type_error(call):
    p, buf, e = _blob_and_entry()
    with pytest.raises(TypeError) as err:
        call(p, buf, e)
    assert str(err.value)  # a message, not a bare TypeError


def test_read_index_file_names_what_it_takes():
    with pytest.raises(TypeError, match=r"path .* or a binary file object .* not NoneType"):
        bf.read_index_file(None)


def test_public_namespace_is_all_and_all_exists():
    public = {n for n in dir(bf) if not n.startswith("_")}
    assert public == set(bf.__all__), (public - set(bf.__all__), set(bf.__all__) - public)


def _run_alone(code: str):
    """Runs `code` in a fresh interpreter with this package: a crash is its
    exit status (a signal), not this test process's."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                          env=env, capture_output=True, text=True, timeout=120)


_SETUP = """
import numpy as np
import blobpipe as bp
KEEP = []
"""


def test_decode_entries_reads_its_entries_from_a_copy_of_a_list_a_decode_may_change():
    # An unpickle (here a pickled value's reduce) empties the caller's list
    # of entries while decode_entries runs; the entries it was given are
    # still the ones decoded.
    done = _run_alone(_SETUP + """
def clear_it():
    ENTRIES.clear()
    KEEP.append([b"\\xff" * 150 for _ in range(20000)])  # reuse the freed memory
    return 0
class Evil:
    def __reduce__(self):
        return (clear_it, ())
p = bp.plan([f"k{i}" for i in range(5)],
            [Evil()] + [np.arange(i + 3, dtype=np.float32) for i in range(4)])
blob = bytearray(p.nbytes)
bp.write(p, memoryview(blob))
ENTRIES = bp.read_index(blob)
out = bp.decode_entries(blob, ENTRIES)
assert ENTRIES == [], ENTRIES
assert out[0] == 0 and [a.tolist() for a in out[1:]] == [
    list(range(n)) for n in (3, 4, 5, 6)], out
print("decoded")
""")
    assert done.returncode == 0 and "decoded" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_decode_entries_holds_the_blob_while_it_decodes():
    # A memoryview blob cannot be released while its entries decode (as
    # with decode_entry): the bytes read later are still the blob's.
    done = _run_alone(_SETUP + """
RELEASED = []
def release_blob():
    try:
        MV.release()
        RELEASED.append(True)
    except BufferError:
        RELEASED.append(False)
    return 0
class Evil:
    def __reduce__(self):
        return (release_blob, ())
big = b"x" * (1 << 22)
p = bp.plan(["a", "b", "c"], [Evil(), big, "tail"])
ba = bytearray(p.nbytes)
bp.write(p, memoryview(ba))
MV = memoryview(ba)
out = bp.decode_entries(MV, bp.read_index(MV))
assert RELEASED == [False], RELEASED
assert out[1] == big and out[2] == "tail"
print("decoded")
""")
    assert done.returncode == 0 and "decoded" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_plan_reads_its_keys_and_values_from_copies_of_lists_a_value_may_change():
    # A value's reduce (run by plan's pickling) empties the caller's list of
    # values: plan still plans the values it was given.
    done = _run_alone(_SETUP + """
class Evil:
    def __reduce__(self):
        VALUES.clear()
        KEYS.clear()
        KEEP.append([b"A" * n for n in range(1, 200) for _ in range(200)])
        return (int, (0,))
KEYS = [f"k{i}" for i in range(6)]
VALUES = [Evil()] + [np.arange(3) for _ in range(5)]
p = bp.plan(KEYS, VALUES)
assert [e.key for e in p.entries] == [f"k{i}" for i in range(6)], p.entries
print("planned")
""")
    assert done.returncode == 0 and "planned" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_an_entry_subclass_equals_only_its_own_class_as_the_dataclass():
    class Sub(bf.Entry):
        pass
    fields = ("k", 64, 12, "t", "int32", (3,))
    sub, entry = Sub(*fields), bf.Entry(*fields)
    assert sub == Sub(*fields) and not sub != Sub(*fields)
    assert sub != entry and entry != sub
    assert not (sub == entry) and not (entry == sub)
    # Its repr names its class and a copy is of its class, as the dataclass's.
    assert repr(sub) == Sub.__qualname__ + repr(entry)[len("Entry"):], repr(sub)
    assert repr(entry).startswith("Entry(key='k', ")
    import copy
    for c in (copy.copy(sub), copy.deepcopy(sub)):
        assert type(c) is Sub and c == sub


def test_decode_entry_reads_str_subclasses_and_an_array_shape_as_the_reference():
    # numpy.str_ fields and a 1-d integer array shape (what a numpy record
    # of the index gives) name the same row as plain str and tuple.
    p = bf.plan(["k"], [np.arange(4, dtype=np.float32)])
    blob = bytearray(p.nbytes)
    bf.write(p, memoryview(blob))
    (row,) = bf.read_index(blob)
    given = bf.Entry(np.array([row.key])[0], np.int64(row.off), np.int64(row.len),
                     np.array([row.kind])[0], np.array([row.dtype])[0], np.array(row.shape))
    got = bf.decode_entry(memoryview(blob)[row.off:row.off + row.len], given)
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0]
    # A 2-d array is no shape.
    with pytest.raises(bf.FormatError):
        bf.decode_entry(memoryview(blob)[row.off:row.off + row.len],
                        bf.Entry(row.key, row.off, row.len, row.kind, row.dtype,
                                 np.array([row.shape])))


def test_from_meta_keeps_fields_no_index_holds_as_given_as_the_reference():
    # A bytes key or kind is kept as given (the reference's from_meta makes
    # the dataclass with them): readable, printable, comparable, never a
    # half-made Entry whose fields raise.
    for key, m in ((b"\xff", {"o": 0, "n": 1, "k": "p"}),
                   ("k", {"o": 0, "n": 1, "k": b"\xff"}),
                   ("k", {"o": 0, "n": 4, "k": "n", "d": b"<\xff4", "s": [1]})):
        e = bf.Entry.from_meta(key, m)
        assert (e.key, e.off, e.len, e.kind, e.dtype, e.shape) == (
            key, m["o"], m["n"], m["k"], m.get("d"), tuple(m.get("s") or ())), repr(e)
        assert e == bf.Entry(key, m["o"], m["n"], m["k"], m.get("d"), tuple(m.get("s") or ()))
        repr(e), hash(e), pickle.loads(pickle.dumps(e))
    assert bf.Entry.from_meta(b"ab", {"o": 0, "n": 1, "k": "p"}).key == b"ab"
    # With a meta's msgpack bytes (blobpipe's own form) the key must be a str.
    packed = bf.Entry("p", 0, 5, "p", None, ()).meta_msgpack()
    assert bf.Entry.from_meta("p", packed) == bf.Entry("p", 0, 5, "p", None, ())
    with pytest.raises(TypeError, match="key must be a str, not bytes"):
        bf.Entry.from_meta(b"p", packed)
