"""Python and C++ over TCP, in two processes: the C++ side is
examples/rollout_to_trainer (its --replay mode), which streams, or checks
byte for byte, every blob of a directory. Python writes that directory with
its codec; then

- Python sender -> C++ trainer (``--listen``): the trainer checks every
  entry the Python Sender emits against the files, exits 0 only if all
  arrived identical (and 1 otherwise, which the negative case checks);
- C++ workers (``--connect``) -> Python Consumer: the Python side checks
  every received row, byte and value against what it wrote.

The binary: $ROLLOUT_TO_TRAINER, else examples/rollout_to_trainer in the
runfiles (the Bazel test's data).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import blobpipe as bf
from stream_cases import finish, same_value, sample_values

BIN = os.environ.get("ROLLOUT_TO_TRAINER", "examples/rollout_to_trainer")


def blob_set() -> list[tuple[str, bytes, dict]]:
    """(file name, tag, values) per blob, in file name order (the order one
    C++ worker sends them)."""
    v = sample_values()
    return [
        ("a_values.blob", b"py-values", v),
        ("b_small.blob", b"py-small", {"0@ids": torch.arange(9), "0@reward": torch.tensor(0.75),
                                      "0@meta": {"idx": 0, "finished": True}}),
        ("c_numpy.blob", b"py-numpy", {"x": np.linspace(0, 1, 33, dtype="<f8"),
                                      "y": np.zeros((2, 0), dtype=np.int16)}),
    ]


def write_blobs(d: Path) -> list[tuple[str, bytes, dict]]:
    blobs = blob_set()
    for name, tag, values in blobs:
        p = bf.plan(list(values), list(values.values()), tag)
        out = bytearray(p.nbytes)
        bf.write(p, out)
        (d / name).write_bytes(out)
    return blobs


def start_cpp(*args: str) -> subprocess.Popen:
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"{BIN} is not an executable (build //examples:rollout_to_trainer)")
    return subprocess.Popen([BIN, "--workers", "1", "--timeout", "60", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def listening_port(proc: subprocess.Popen) -> int:
    """The port of `--listen 127.0.0.1:0`, from the line that names it."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"-> trainer, tcp 127\.0\.0\.1:(\d+),", line)
        if m:
            return int(m.group(1))
    proc.wait()
    pytest.fail(f"{BIN} named no port:\n{''.join(lines)}")


def stream_to_cpp(tmp_path: Path, change=None) -> tuple[int, str]:
    blobs = write_blobs(tmp_path)
    proc = start_cpp("--listen", "127.0.0.1:0", "--replay", str(tmp_path))
    try:
        port = listening_port(proc)
        with bf.connect(f"tcp://127.0.0.1:{port}") as sender:
            for name, tag, values in blobs:
                with sender.open_blob(tag) as blob:
                    for k, v in values.items():
                        blob.emit(k, change(k, v) if change else v)
    finally:
        rc, out = finish(proc)
    return rc, out


def test_python_sender_to_cpp_trainer(tmp_path):
    rc, out = stream_to_cpp(tmp_path)
    assert rc == 0, out
    assert "OK: replayed 3 blobs; every entry is byte-identical to its file" in out


def test_cpp_trainer_notices_a_changed_entry(tmp_path):
    """The check above can fail: one changed element and the trainer says so."""
    def change(k, v):
        if k != "f32":
            return v
        v = v.clone()
        v[0, 0] += 1
        return v

    rc, out = stream_to_cpp(tmp_path, change)
    assert rc == 1, out
    assert "no file has this row with these bytes" in out


def test_cpp_workers_to_python_consumer(tmp_path):
    blobs = write_blobs(tmp_path)
    files = {name: (tmp_path / name).read_bytes() for name, _, _ in blobs}
    with bf.listen("tcp://127.0.0.1:0") as listener:
        proc = start_cpp("--connect", f"127.0.0.1:{listener.port}", "--replay", str(tmp_path))
        try:
            with listener.accept(timeout=60) as consumer:
                events = list(consumer)  # ends when the workers shut down
        finally:
            rc, out = finish(proc)
    assert rc == 0, out

    pos = 0
    for name, tag, values in blobs:
        blob = files[name]
        index = bf.read_index(blob)
        for e, (key, want) in zip(index, values.items()):
            ev = events[pos]
            pos += 1
            assert isinstance(ev, bf.EntryReady), ev
            assert ev.tag == tag.ljust(16, b"\0")
            assert ev.entry.meta() == e.meta() and ev.key == key
            assert bytes(ev.buffer) == blob[e.off:e.off + e.len], key
            assert same_value(ev.value, want), key
        done = events[pos]
        pos += 1
        assert isinstance(done, bf.BlobComplete) and done.tag == tag.ljust(16, b"\0")
        assert [x.meta() for x in done.entries] == [x.meta() for x in index]
    assert pos == len(events), events[pos:]
