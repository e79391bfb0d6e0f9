"""Checks of the package without torch, each run by test_no_torch.py in a
process of its own: ``python3 no_torch_checks.py CHECK_NAME``.

torch is blocked before anything can import it (``sys.modules["torch"] =
None`` makes ``import torch`` raise ImportError), as on a machine without
it. Kind ``t`` entries must then decode to numpy arrays of their dtype, or
to a RawEntry where numpy has none (bfloat16, float8), never an error and
never another dtype.
"""

from __future__ import annotations

import sys

sys.modules["torch"] = None  # type: ignore[assignment]

import numpy as np  # noqa: E402

import blobpipe as bf  # noqa: E402
from blob_cases import assert_values, blob_bytes, case, listed_entries  # noqa: E402


def check_torch_cannot_be_imported():
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    raise AssertionError("torch imported although blocked")


def check_golden_tensors_decode_to_numpy_or_raw():
    for name in ("torch_dtypes", "rollout_sample", "zero_len", "noncontig", "single_f32"):
        c = case(name)
        blob = blob_bytes(c["file"])
        idx = bf.read_index(blob)
        for e, m in zip(idx, listed_entries(c)):
            v = bf.decode_entry(memoryview(blob)[e.off: e.off + e.len], e)
            if e.kind == bf.KIND_TENSOR and e.dtype == "bfloat16":
                assert isinstance(v, bf.RawEntry), v
                assert (v.kind, v.dtype, v.shape) == ("t", "bfloat16", e.shape)
                assert v.tobytes() == blob[e.off: e.off + e.len]
            elif e.kind == bf.KIND_TENSOR:
                assert isinstance(v, np.ndarray) and v.dtype == np.dtype(e.dtype), (e, v)
                assert v.shape == e.shape
            assert_values(v, m)
    assert "torch" not in sys.modules or sys.modules["torch"] is None


def check_float8_and_unsigned_tensors_decode_without_torch():
    data = np.arange(12, dtype=np.uint8)
    values = [bf.RawEntry("t", "float8_e5m2", (3, 4), data), bf.RawEntry("t", "uint32", (3,), data),
              bf.RawEntry("t", "uint64", (), data[:8]), bf.RawEntry("t", "bfloat16", (6,), data)]
    p = bf.plan(["f8", "u32", "u64", "bf16"], values)
    blob = bytearray(p.nbytes)
    bf.write(p, blob)
    mv = memoryview(blob)
    f8, u32, u64, bf16 = (bf.decode_entry(mv[e.off: e.off + e.len], e) for e in bf.read_index(blob))
    assert f8 == values[0] and bf16 == values[3]
    assert u32.dtype == np.uint32 and u32.tolist() == data.view("<u4").tolist()
    assert u64.dtype == np.uint64 and u64.shape == () and int(u64) == int(data[:8].view("<u8")[0])
    copy = bf.materialize(f8)
    blob[0] ^= 0xFF
    assert copy == values[0] and f8 != values[0]


def check_codec_works_without_torch():
    values = [np.arange(6, dtype=">i4").reshape(2, 3), {"meta": 1}, np.float64(2.5), "text"]
    p = bf.plan(["a", "b", "c", "d"], values, tag=b"no-torch")
    blob = np.zeros(p.nbytes, np.uint8)
    bf.write(p, blob)
    idx = bf.read_index(blob)
    got = [bf.materialize(bf.decode_entry(memoryview(blob)[e.off: e.off + e.len], e)) for e in idx]
    assert np.array_equal(got[0], values[0]) and got[0].dtype.str == ">i4"
    assert got[1:] == values[1:]
    assert bf.footer_tag(blob) == b"no-torch" + bytes(8)


if __name__ == "__main__":
    globals()[sys.argv[1]]()
    print("ok")
