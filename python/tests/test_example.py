"""examples/python/rollout_to_trainer.py, run briefly: Python workers ->
Python trainer in one process, Python workers -> the C++ trainer, and C++
workers -> the Python trainer (each trainer checks every sample byte for
byte and exits 0 only if all arrived identical)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from stream_cases import finish

EXAMPLE = "examples/python/rollout_to_trainer.py"
BIN = os.environ.get("ROLLOUT_TO_TRAINER", "examples/rollout_to_trainer")
ARGS = ["--workers", "2", "--batch", "24", "--timeout", "60"]


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def python(*args: str) -> list[str]:
    return [sys.executable, EXAMPLE, *args, *ARGS]


def port_of(proc: subprocess.Popen, pattern: str) -> tuple[int, str]:
    """The port the first line names, and that line."""
    line = proc.stdout.readline()
    m = re.search(pattern, line)
    if not m:
        rc, out = finish(proc, line)
        pytest.fail(f"no port in the first line (exit {rc}):\n{out}")
    return int(m.group(1)), line


def test_python_workers_to_python_trainer():
    rc, out = finish(start(python()))
    assert rc == 0, out
    assert "trainer: 24/24 samples, 120 entries" in out
    assert "OK: every sample arrived complete" in out


def test_python_workers_to_cpp_trainer():
    trainer = start([BIN, "--listen", "127.0.0.1:0", *ARGS])
    port, head = port_of(trainer, r"tcp 127\.0\.0\.1:(\d+),")
    rc_w, out_w = finish(start(python("--connect", f"127.0.0.1:{port}")))
    rc, out = finish(trainer, head)
    assert rc_w == 0, out_w
    assert rc == 0, out
    assert "OK: every sample arrived complete (5 keys) and identical to what its worker built" \
        in out


def test_cpp_workers_to_python_trainer():
    trainer = start(python("--listen", "127.0.0.1:0"))
    port, head = port_of(trainer, r"tcp://127\.0\.0\.1:(\d+),")
    rc_w, out_w = finish(start([BIN, "--connect", f"127.0.0.1:{port}", *ARGS]))
    rc, out = finish(trainer, head)
    assert rc_w == 0, out_w
    assert rc == 0, out
    assert "trainer: 24/24 samples" in out and "OK: every sample arrived complete" in out


def test_trainer_fails_when_workers_send_too_few_samples():
    """The check can fail: the trainer expects 24 samples, workers send 8."""
    trainer = start(python("--listen", "127.0.0.1:0"))
    port, head = port_of(trainer, r"tcp://127\.0\.0\.1:(\d+),")
    workers = start([sys.executable, EXAMPLE, "--connect", f"127.0.0.1:{port}",
                     "--workers", "2", "--batch", "8"])
    finish(workers)
    rc, out = finish(trainer, head)
    assert rc == 1, out
    assert "16 sample(s) incomplete or missing" in out


def test_python_workers_to_cpp_rank_say_why_groups_did_not_complete():
    """A C++ fan-in rank (--listen tcp://...) checks GRPO groups; the Python
    workers send no blob groups, so the rank fails, and its FAIL line says
    which groups are missing and why rather than exiting 1 in silence."""
    rank = start([BIN, "--listen", "tcp://127.0.0.1:0", "--group-size", "4", *ARGS])
    port, head = port_of(rank, r"tcp://127\.0\.0\.1:(\d+)")
    rc_w, out_w = finish(start(python("--connect", f"127.0.0.1:{port}")))
    rc, out = finish(rank, head)
    assert rc_w == 0, out_w
    assert rc == 1, out
    assert "FAIL: rank 0: 0 of 6 groups complete" in out, out
    assert "24 blob(s) named no group (blob_group)" in out, out
