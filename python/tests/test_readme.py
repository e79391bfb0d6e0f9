"""The README's "Python" section runs as written: its ``python`` code
blocks, extracted from README.md (in the runfiles), executed in order.

The codec blocks run exactly as written. The streaming block is the two
halves of a worker and a trainer; here they run in one process, the
trainer's half on a thread, with the host ``trainer`` and port 5555 (a
placeholder and a fixed port, which another program may hold) replaced by
127.0.0.1 and a free port, and ``train_on``/``drop`` (the application's)
defined to record what they are given."""

from __future__ import annotations

import os
import re
import socket
import threading

import pytest

import blobpipe as bf

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def python_blocks() -> list[str]:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("\n## Python\n"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_python_section_has_its_codec_and_streaming_blocks():
    blocks = python_blocks()
    assert len(blocks) == 3, [b[:40] for b in blocks]
    assert "bf.plan(" in blocks[0] and "write_tail" in blocks[1] and "bf.connect(" in blocks[2]


def test_the_codec_blocks_run_as_written():
    pytest.importorskip("torch", reason="the README's blocks use torch")
    ns: dict = {}
    blocks = python_blocks()
    exec(compile(blocks[0], "README block 1", "exec"), ns)
    exec(compile(blocks[1], "README block 2", "exec"), ns)
    assert ns["bf"].read_index(ns["store"]) == ns["p"].entries


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_streaming_block_runs_with_a_local_host_and_a_free_port():
    torch = pytest.importorskip("torch", reason="the README's blocks use torch")
    block = python_blocks()[2]
    worker, trainer = block.split("\n\n", 1)
    port = free_port()
    worker = worker.replace("tcp://trainer:5555", f"tcp://127.0.0.1:{port}")
    trainer = trainer.replace("tcp://0.0.0.0:5555", f"tcp://127.0.0.1:{port}")
    assert str(port) in worker and str(port) in trainer
    got: list = []
    listening = threading.Event()
    real_listen = bf.listen

    def listen(*args, **kwargs):  # the trainer's listen(), then the worker may connect
        listener = real_listen(*args, **kwargs)
        listening.set()
        return listener

    trainer_ns = {"bf": bf, "torch": torch, "train_on": lambda k, v: got.append((k, v)),
                  "drop": lambda tag: got.append(("dropped", tag))}
    failed: list = []

    def run_trainer():
        try:
            bf.listen = listen
            exec(compile(trainer, "README block 3 (trainer)", "exec"), trainer_ns)
        except BaseException as e:  # reported by the main thread
            failed.append(e)
            listening.set()

    t = threading.Thread(target=run_trainer, daemon=True)
    t.start()
    try:
        assert listening.wait(30), "the trainer did not listen"
        assert not failed, failed
        exec(compile(worker, "README block 3 (worker)", "exec"), {"bf": bf, "torch": torch})
        t.join(30)
    finally:
        bf.listen = real_listen
    assert not t.is_alive(), "the trainer's loop did not end when the worker shut down"
    assert not failed, failed
    assert [k for k, _ in got] == ["0@input_ids", "0@meta"]
    assert torch.equal(got[0][1], torch.arange(6)) and got[1][1] == {"idx": 0}
