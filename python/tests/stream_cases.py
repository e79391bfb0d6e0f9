"""Values and helpers shared by the streaming tests (test_stream*.py) and
the example's test.

``sample_values()`` is a set of entries of several dtypes and shapes (0-d,
empty, non-contiguous, one larger than the default copy threshold) and a
pickled meta dict; ``same_value(a, b)`` compares a received value with the
one sent (dtype, shape and bytes, or equality for pickles).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest
import torch

import blobpipe as bf


def sample_values() -> dict[str, Any]:
    g = torch.Generator().manual_seed(18)
    return {
        "f32": torch.randn(4, 5, generator=g),
        "f64": torch.randn(3, generator=g, dtype=torch.float64),
        "bf16": torch.randn(2, 3, generator=g).to(torch.bfloat16),
        "f16": torch.randn(7, generator=g).to(torch.float16),
        "i64": torch.arange(-5, 5, dtype=torch.int64),
        "i8": torch.arange(-3, 3, dtype=torch.int8).view(2, 3),
        "u8": torch.arange(250, 256, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(0.5),                       # 0-d: one element
        "empty": torch.zeros(0, 3),                        # 0 bytes
        "transposed": torch.arange(12.0).view(3, 4).t(),   # non-contiguous
        "big": torch.arange(300_000, dtype=torch.float32),  # 1.2 MB: held, not copied
        "np_be_i4": np.arange(6, dtype=">i4").reshape(2, 3),
        "np_c64": np.array([1 + 2j, -3j], dtype=np.complex64),
        "meta": {"idx": 7, "source": "test", "scores": [0.25, 0.5], "done": True, "none": None},
    }


def same_value(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.dtype == want.dtype
                and tuple(got.shape) == tuple(want.shape) and torch.equal(got, want))
    if isinstance(want, np.ndarray):
        return (isinstance(got, np.ndarray) and got.dtype == want.dtype
                and got.shape == want.shape and np.array_equal(got, want))
    return got == want


def pickled(v: Any) -> bytes:
    """The bytes a kind ``p`` entry of ``v`` holds (the reference's rule)."""
    return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


def wait_until(cond: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    """Polls ``cond`` until it holds; fails (AssertionError) after
    ``seconds``, a bound for a hung test, not a timing assertion."""
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"still waiting after {seconds} s for {what}")
        time.sleep(0.005)


class Thread(threading.Thread):
    """A thread that keeps what its target returned or raised (join_result
    re-raises it in the caller)."""

    def __init__(self, target: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._target_fn = target
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as e:  # handed to join_result
            self.error = e

    def join_result(self, seconds: float = 120.0) -> Any:
        self.join(seconds)
        if self.is_alive():
            raise AssertionError(f"thread still running after {seconds} s")
        if self.error is not None:
            raise self.error
        return self.result


def tcp_pair(sender_options: dict | None = None, consumer_options: dict | None = None):
    """A Sender and a Consumer joined over TCP on 127.0.0.1 (port 0), and the
    Listener (close it after the consumer)."""
    listener = bf.listen("tcp://127.0.0.1:0", **(consumer_options or {}))
    acc = Thread(lambda: listener.accept(timeout=60))
    acc.start()
    sender = bf.connect(f"tcp://127.0.0.1:{listener.port}", **(sender_options or {}))
    return sender, acc.join_result(), listener


class Pair:
    """``with Pair(transport) as (sender, consumer):``, transport "inproc"
    (loopback_pair) or "tcp"; closes all three at the end."""

    def __init__(self, transport: str, sender_options: dict | None = None,
                 consumer_options: dict | None = None) -> None:
        self.listener = None
        if transport == "inproc":
            self.sender, self.consumer = bf.loopback_pair(sender_options=sender_options,
                                                          consumer_options=consumer_options)
        else:
            self.sender, self.consumer, self.listener = tcp_pair(sender_options,
                                                                 consumer_options)

    def __enter__(self):
        return self.sender, self.consumer

    def __exit__(self, *exc) -> None:
        self.sender.close()
        self.consumer.close()
        if self.listener is not None:
            self.listener.close()


def finish(proc: subprocess.Popen, head: str = "") -> tuple[int, str]:
    """Waits (at most 120 s, then fails the test) for a process started with
    stdout=PIPE, stderr=STDOUT, text=True; copies ``head`` (lines already
    read) and its output into the test log. (exit status, output)."""
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"{proc.args} did not end; its output:\n{head}{out}")
    sys.stdout.write(head + out)
    return proc.returncode, head + out
