"""Every case of ../shared/golden through the Python API: rows, footers,
values and digests of valid blobs, byte-identical re-encoding, the shard
read with read_index_file, and each invalid blob's error category."""

from __future__ import annotations

import io

import numpy as np
import pytest

import blobpipe as bf
from blob_cases import (assert_values, blob_bytes, case, cases, golden_dir, listed_entries,
                        manifest_row, row, sha256, value_bytes)

VALID = [c for c in cases(valid=True)]
INVALID = [c for c in cases(valid=False)]


def by_name(cs):
    return pytest.mark.parametrize("c", cs, ids=[c["name"] for c in cs])


def entries_of(c: dict, idx: list[bf.Entry]) -> list[bf.Entry]:
    """The decoded rows the manifest lists (all, or head and tail)."""
    if "entries" in c:
        return idx
    return idx[: len(c["entries_head"])] + idx[len(idx) - len(c["entries_tail"]):]


def entry_view(blob: bytes, e: bf.Entry) -> memoryview:
    return memoryview(blob)[e.off: e.off + e.len]


@by_name(VALID)
def test_rows_and_footer(c):
    blob = blob_bytes(c["file"])
    idx = bf.read_index(blob)
    assert len(idx) == (c["entry_count"] if "entry_count" in c else len(c["entries"]))
    assert [row(e) for e in entries_of(c, idx)] == [manifest_row(m) for m in listed_entries(c)]
    assert bf.footer_is_valid(blob)
    tag = bytes.fromhex(c["tag_hex"])
    assert bf.footer_tag(blob) == (None if tag == bf.NO_TAG else tag)
    assert bf.footer_tag(blob[-bf.FOOTER_SIZE:]) == bf.footer_tag(blob)


@by_name(VALID)
def test_entry_meta(c):
    idx = bf.read_index(blob_bytes(c["file"]))
    for e, m in zip(entries_of(c, idx), listed_entries(c)):
        assert e.meta_msgpack().hex() == m["meta_msgpack_hex"]
        meta = bf.Entry.from_meta(e.key, bytes.fromhex(m["meta_msgpack_hex"]))
        # The reference's from_meta gives a pickle the shape ().
        expected = bf.Entry(e.key, e.off, e.len, e.kind, e.dtype, e.shape or ())
        assert meta == expected
        assert bf.Entry.from_meta(e.key, e.meta()) == expected


@by_name(VALID)
def test_values_and_digests(c):
    blob = blob_bytes(c["file"])
    idx = bf.read_index(blob)
    for e, m in zip(entries_of(c, idx), listed_entries(c)):
        v = bf.decode_entry(entry_view(blob, e), e)
        assert_values(v, m)
        raw = bf.decode_entry(entry_view(blob, e), e, allow_pickle=False)
        got = raw if e.kind == bf.KIND_PICKLE else value_bytes(raw)
        assert sha256(got) == m["sha256"], e


@by_name([c for c in VALID if c["footer_version"] == 3])
def test_reencode_is_byte_identical(c):
    blob = blob_bytes(c["file"])
    idx = bf.read_index(blob)
    values = [bf.decode_entry(entry_view(blob, e), e) for e in idx]
    p = bf.plan([e.key for e in idx], values, tag=bytes.fromhex(c["tag_hex"]))
    assert (p.nbytes, p.index_off, len(p.index_bytes)) == (c["nbytes"], c["index_off"], c["index_len"])
    assert sha256(p.index_bytes) == c["index_sha256"]
    assert p.entries == idx
    out = np.full(p.nbytes, 0xAB, dtype=np.uint8)  # write() zeroes the pads itself
    bf.write(p, out)
    assert sha256(out) == c["blob_sha256"]
    assert out.tobytes() == blob
    tail = bytearray(len(p.index_bytes) + bf.FOOTER_SIZE)
    bf.write_tail(p, tail)
    assert bytes(tail) == blob[p.index_off:]


def test_v2_footer_decodes_like_single_f32():
    v2, v3 = case("v2_footer"), case("single_f32")
    b2, b3 = blob_bytes(v2["file"]), blob_bytes(v3["file"])
    idx2, idx3 = bf.read_index(b2), bf.read_index(b3)
    assert idx2 == idx3
    assert bf.footer_tag(b2) is None
    got = bf.decode_entry(entry_view(b2, idx2[0]), idx2[0])
    assert_values(got, v3["entries"][0])


@pytest.mark.parametrize("opener", ["path", "binary file"])
def test_shard_blobs_read_with_read_index_file(opener):
    c = case("shard")
    path = golden_dir() / c["file"]
    data = path.read_bytes()
    with open(path, "rb") as f:
        for b in c["blobs"]:
            src = path if opener == "path" else f
            idx = bf.read_index_file(src, b["off"], b["nbytes"])
            assert [row(e) for e in idx] == [manifest_row(m) for m in b["entries"]]
            for e, m in zip(idx, b["entries"]):
                start = b["off"] + e.off
                assert_values(bf.decode_entry(data[start: start + e.len], e), m)
    # nbytes 0: to the end of the file, so the last blob alone.
    last = c["blobs"][-1]
    alone = bf.read_index_file(path, last["off"], last["nbytes"])
    assert bf.read_index_file(str(path), last["off"]) == alone
    assert bf.read_index_file(io.BytesIO(data), last["off"]) == alone


@by_name(INVALID)
def test_invalid_blob_error_category(c):
    blob = blob_bytes(c["file"])
    for read in (lambda: bf.read_index(blob), lambda: bf.read_index(bytearray(blob)),
                 lambda: bf.read_index_file(golden_dir() / c["file"]),
                 lambda: bf.read_index_file(io.BytesIO(blob))):
        with pytest.raises(bf.FormatError) as err:
            read()
        assert err.value.category == c["expected_error"]
        assert isinstance(err.value, ValueError)
    assert bf.footer_is_valid(blob) == (c["expected_error"] not in ("too_small", "bad_footer"))
