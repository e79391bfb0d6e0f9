"""The golden cases of ../shared/golden (made by the Python reference codec)
and helpers to compare decoded values with the manifest's.

The golden directory: $BLOBPIPE_GOLDEN_DIR when set (bazel/bazelw sets it),
else shared/golden beside the clone (found from this file's real path, since
Bazel runs the tests from symlinks into the source tree).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

import blobpipe as bf


def golden_dir() -> Path:
    env = os.environ.get("BLOBPIPE_GOLDEN_DIR")
    d = Path(env) if env else Path(os.path.realpath(__file__)).parents[2] / ".." / "shared" / "golden"
    if not (d / "manifest.json").is_file():
        raise FileNotFoundError(f"golden cases not found: no manifest.json in {d}")
    return d


@functools.lru_cache(maxsize=None)
def manifest() -> dict:
    return json.loads((golden_dir() / "manifest.json").read_text())


def cases(valid: bool) -> list[dict]:
    """Blob cases (not the shard), valid or invalid."""
    return [c for c in manifest()["cases"] if c["valid"] == valid and c.get("kind") != "shard"]


def case(name: str) -> dict:
    return next(c for c in manifest()["cases"] if c["name"] == name)


@functools.lru_cache(maxsize=None)
def blob_bytes(file: str) -> bytes:
    return (golden_dir() / file).read_bytes()


def sha256(b: Any) -> str:
    return hashlib.sha256(b).hexdigest()


def listed_entries(c: dict) -> list[dict]:
    """The manifest's rows of a case: all of them, or for the big case the
    head and tail it lists (entry_count says how many there are)."""
    return c["entries"] if "entries" in c else c["entries_head"] + c["entries_tail"]


def row(e: bf.Entry) -> dict:
    return {"key": e.key, "off": e.off, "len": e.len, "kind": e.kind, "dtype": e.dtype,
            "shape": None if e.shape is None else list(e.shape)}


def manifest_row(m: dict) -> dict:
    return {k: m[k] for k in ("key", "off", "len", "kind", "dtype", "shape")}


def bfloat16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype("<u4") << 16).view("<f4")


def as_numpy(v: Any) -> np.ndarray:
    """A decoded tensor, array or RawEntry (bfloat16) as a numpy array of
    the same values."""
    if isinstance(v, bf.RawEntry):
        assert v.dtype == "bfloat16", v
        return bfloat16_bits_to_float(v.data.view("<u2")).reshape(v.shape)
    if isinstance(v, np.ndarray):
        return v
    import torch  # a tensor was decoded, so torch is here

    if v.dtype == torch.bfloat16:
        v = v.float()
    return v.numpy()


def value_bytes(v: Any) -> bytes:
    """The bytes a decoded tensor, array or RawEntry views."""
    if isinstance(v, bf.RawEntry):
        return v.tobytes()
    if isinstance(v, np.ndarray):
        return v.tobytes()
    import torch

    return v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b""


def assert_values(v: Any, m: dict) -> None:
    """Checks a decoded value against the manifest entry `m`: dtype, shape
    and values (exact: the manifest's floats are the stored ones widened)."""
    if m["kind"] == "p":
        assert repr(v) == m["py_repr"]
        return
    arr = as_numpy(v)
    assert list(arr.shape) == m["shape"]
    if m["kind"] == "n":
        assert arr.dtype.str == m["dtype"]
    if m["values"] is None:  # strings, datetimes, records: bytes only
        return
    expected = np.asarray(m["values"])
    if np.iscomplexobj(arr):
        got = np.stack([arr.real, arr.imag], axis=-1).reshape(-1, 2)
        assert np.array_equal(got, expected.reshape(-1, 2))
    else:
        assert arr.reshape(-1).tolist() == expected.reshape(-1).tolist()
