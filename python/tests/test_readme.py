"""The README's code runs as written: its ``python`` code blocks,
extracted from README.md (in the runfiles), executed, and its C++ example
is the marked lines of examples/stream_minimal.cpp, which //test:examples_test
runs.

The codec blocks of "Python" run exactly as written. The streaming block
of "In ten lines" is the two halves of a worker and a trainer; here they
run in one process, the trainer's half on a thread, with the host
``trainer`` and port 5555 (a placeholder and a fixed port, which another
program may hold) replaced by 127.0.0.1 and a free port, and
``train_on``/``drop`` (the application's) defined to record what they are
given."""

from __future__ import annotations

import os
import re
import socket
import textwrap
import threading

import pytest

import blobpipe as bf

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
README = os.path.join(ROOT, "README.md")
STREAM_MINIMAL = os.path.join(ROOT, "examples", "stream_minimal.cpp")


def blocks_of(section: str, language: str) -> list[str]:
    """The ``language`` code blocks of the README's ``## section``."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    body = text[text.index(f"\n## {section}\n"):]
    body = body[:body.index("\n## ", 1)]
    return re.findall(rf"```{language}\n(.*?)```", body, re.S)


def python_blocks() -> list[str]:
    """The codec blocks of "Python", then the streaming block of "In ten lines"."""
    return blocks_of("Python", "python") + blocks_of("In ten lines", "python")


def test_the_readme_has_its_codec_and_streaming_blocks():
    codec, streaming = blocks_of("Python", "python"), blocks_of("In ten lines", "python")
    assert len(codec) == 2, [b[:40] for b in codec]
    assert len(streaming) == 1, [b[:40] for b in streaming]
    assert "bf.plan(" in codec[0] and "write_tail" in codec[1] and "bf.connect(" in streaming[0]


def test_the_cpp_example_is_stream_minimals_marked_lines():
    # The README's C++ block is the lines between "README: begin" and
    # "README: end" in examples/stream_minimal.cpp, each region without its
    # indent, regions apart by a blank line; the program is built and run
    # by //test:examples_test (stream_minimal_prints_each_entry_as_it_arrives).
    with open(STREAM_MINIMAL, encoding="utf-8") as f:
        source = f.read()
    regions = re.findall(r"\n[ ]*// README: begin\n(.*?)\n[ ]*// README: end\n", source, re.S)
    assert len(regions) == 2, regions
    example = "\n\n".join(textwrap.dedent(r) for r in regions) + "\n"
    (block,) = blocks_of("In ten lines", "cpp")
    assert block == example


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
