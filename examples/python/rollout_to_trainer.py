#!/usr/bin/python3
"""Rollout workers stream samples to a trainer as NVDP blobs over TCP, in Python.

    PYTHONPATH=bazel-bin/python /usr/bin/python3 examples/python/rollout_to_trainer.py
    ... rollout_to_trainer.py --batch 64 --workers 2
    # two processes (either side may be the C++ example, examples/rollout_to_trainer):
    ... rollout_to_trainer.py --listen 127.0.0.1:5555 &
    ... rollout_to_trainer.py --connect 127.0.0.1:5555   # or a URL: tcp://..., ucx://...
    bazel-bin/examples/rollout_to_trainer --listen 127.0.0.1:5555 &
    ... rollout_to_trainer.py --connect 127.0.0.1:5555

The Python twin of the C++ example (examples/README.md): each worker thread
connects with blobpipe.connect and streams one blob per sample, keyed as
NeMo RL's data plane keys them: "{n}@input_ids" (int64 [T], the UTF-8 bytes
of a prompt and its response from examples/data/corpus.txt),
"{n}@generation_logprobs" (float32 [T], 0 on the prompt, a byte-bigram
model's log-probability on the response), "{n}@token_mask" (bool [T]),
"{n}@reward" (float32, shape []) and "{n}@meta" (a pickled dict). The
samples are built exactly as the C++ workers build them, byte for byte, so
the C++ trainer accepts them and this trainer accepts the C++ workers'.

The trainer listens with blobpipe.listen, iterates its consumers with
`async for` (one asyncio task per worker connection), rebuilds every sample
it receives and compares each entry's kind, dtype, shape and bytes; it
shows progress, then throughput, and exits 0 when every sample arrived
complete and identical, 1 when something is missing or different or a
connection failed, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import pickle
import pickletools
import string
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

import blobpipe as bf

FIELDS = ("input_ids", "generation_logprobs", "token_mask", "reward", "meta")
CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus.txt"
PRIOR_WEIGHT = 4.0  # weight of the unigram prior in the bigram estimate
LETTERS = frozenset(string.ascii_letters.encode() + b" ")


# ---- the samples (examples/rollout/{corpus,sample}.cpp, lib/format/pickle.cpp) ----

def split_entry(entry: bytes) -> tuple[bytes, bytes, str]:
    """(prompt, response, source) of one fortune entry (corpus.hpp's rules)."""
    source = "riddles" if entry.startswith(b"Q:") else "fortunes"
    a = entry.find(b"\nA:")
    nl = entry.find(b"\n")
    if a >= 0:
        cut = a + 1
    elif nl >= 0:
        cut = nl + 1
    else:
        cut = one_line_split(entry)
    cut = min(cut, len(entry) - 1)
    return entry[:cut], entry[cut:], source


def one_line_split(s: bytes) -> int:
    for i in range(len(s) - 1):
        if s[i] in b".!?;" and s[i + 1] == ord(" "):
            j = len(s) - len(s[i + 1:].lstrip(b" "))
            if j < len(s):
                return j
    mid = len(s) // 2
    sp = s.rfind(b" ", 0, mid + 1)
    return max(mid, 1) if sp <= 0 else sp + 1


def parse_corpus(text: bytes) -> list[tuple[bytes, bytes, str]]:
    pairs, entry = [], []
    for line in text.split(b"\n"):
        if line == b"%":
            e = b"".join(entry).rstrip(b"\n")
            if e:
                pairs.append(split_entry(e))
            entry = []
        else:
            entry.append(line + b"\n")
    # The last line of a file ending in "\n" is empty: as the C++ parser, it
    # adds nothing but that newline, which rstrip removes.
    e = b"".join(entry).rstrip(b"\n")
    if e:
        pairs.append(split_entry(e))
    return pairs


class SampleBuilder:
    """Builds sample n deterministically, as rollout::sample_builder does."""

    def __init__(self, corpus: Path = CORPUS) -> None:
        self.pairs = parse_corpus(corpus.read_bytes())
        uni = np.zeros(256, dtype=np.float64)
        self.bigram = np.zeros((256, 256), dtype=np.float64)
        for prompt, response, _ in self.pairs:
            b = np.frombuffer(prompt + response, dtype=np.uint8)
            np.add.at(uni, b, 1)
            np.add.at(self.bigram, (b[:-1], b[1:]), 1)
        total = uni.sum()
        self.row_total = self.bigram.sum(axis=1)
        self.unigram = (uni + 1.0) / (total + 256.0)

    def logprob(self, prev: int, nxt: int) -> float:
        p = (self.bigram[prev, nxt] + PRIOR_WEIGHT * self.unigram[nxt]) / \
            (self.row_total[prev] + PRIOR_WEIGHT)
        return math.log(p)  # the same libm log as std::log

    def make(self, idx: int) -> dict[str, object]:
        """The five values of sample idx, keyed "{idx}@{field}"."""
        n = idx % len(self.pairs)
        prompt, response, source = self.pairs[n]
        text = prompt + response
        logprobs = np.zeros(len(text), dtype=np.float32)
        for i in range(len(prompt), len(text)):
            logprobs[i] = self.logprob(text[i - 1], text[i])
        mask = np.zeros(len(text), dtype=np.bool_)
        mask[len(prompt):] = True
        good = sum(1 for c in response if c in LETTERS)
        reward = np.float32(good) / np.float32(len(response))
        meta = {"idx": idx, "source": source, "entry": n, "prompt_tokens": len(prompt),
                "response_tokens": len(response), "finished": True, "stop_reason": None}
        # The C++ workers write a protocol-2 pickle without memo opcodes,
        # which is what pickletools.optimize leaves of pickle.dumps(meta, 2).
        # A RawEntry of kind "p" is emitted as these bytes, not pickled again
        # (emitting the dict would pickle it with HIGHEST_PROTOCOL: the same
        # dict for pickle.loads, other bytes for the C++ trainer's check).
        meta_bytes = pickletools.optimize(pickle.dumps(meta, protocol=2))
        values = [
            torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64),
            torch.from_numpy(logprobs),
            torch.from_numpy(mask),
            torch.tensor(float(reward), dtype=torch.float32),
            bf.RawEntry("p", "", (), np.frombuffer(meta_bytes, dtype=np.uint8)),
        ]
        return {f"{idx}@{f}": v for f, v in zip(FIELDS, values)}


def entry_bytes(v: object) -> bytes:
    if isinstance(v, torch.Tensor):
        return v.numpy().tobytes()  # these dtypes numpy has
    return v.tobytes()  # RawEntry


# ---- workers ----

def run_worker(url: str, wid: int, workers: int, batch: int, builder: SampleBuilder,
               report: list) -> None:
    try:
        with bf.connect(url, stall_timeout=60) as sender:
            for n in range(wid, batch, workers):
                with sender.open_blob() as blob:
                    for key, value in builder.make(n).items():
                        blob.emit(key, value)
            report[wid] = ("ok", sender.stats())
    except bf.Error as e:
        report[wid] = ("failed", f"worker {wid}: {type(e).__name__}: {e}")


def run_workers(url: str, workers: int, batch: int, builder: SampleBuilder) -> bool:
    report: list = [None] * workers
    threads = [threading.Thread(target=run_worker, args=(url, w, workers, batch, builder, report))
               for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = all(r[0] == "ok" for r in report)
    for r in report:
        if r[0] != "ok":
            print(r[1], file=sys.stderr)
    sent = sum(r[1]["entries_sent"] for r in report if r[0] == "ok")
    print(f"workers: {workers} connection(s) sent {sent} entries"
          + ("" if ok else "; some FAILED"), flush=True)
    return ok


# ---- trainer ----

class Trainer:
    def __init__(self, builder: SampleBuilder, batch: int) -> None:
        self.builder, self.batch = builder, batch
        self.got: dict[int, set[str]] = {}
        self.expected: dict[int, dict] = {}  # samples being received
        self.complete = self.entries = self.bytes = 0
        self.problems: list[str] = []
        self.first_entry: float | None = None

    def on_entry(self, ev: bf.EntryReady) -> None:
        if self.first_entry is None:
            self.first_entry = time.monotonic()
        self.entries += 1
        self.bytes += ev.entry.len
        idx_text, _, name = ev.key.partition("@")
        if not idx_text.isdigit() or name not in FIELDS or int(idx_text) >= self.batch:
            self.problems.append(f"unexpected key {ev.key!r}")
            return
        idx = int(idx_text)
        seen = self.got.setdefault(idx, set())
        if name in seen:
            self.problems.append(f"{ev.key!r}: arrived twice")
            return
        # Rebuild the sample on its first entry; drop it once complete.
        if idx not in self.expected:
            self.expected[idx] = self.builder.make(idx)
        want = self.expected[idx][ev.key]
        e = ev.entry
        want_kind = "p" if isinstance(want, bf.RawEntry) else "t"
        if e.kind != want_kind or (want_kind == "t" and (
                e.dtype != str(want.dtype).removeprefix("torch.") or tuple(e.shape) != tuple(want.shape))):
            self.problems.append(f"{ev.key!r}: kind, dtype or shape differs")
        elif bytes(ev.buffer) != entry_bytes(want):
            self.problems.append(f"{ev.key!r}: bytes differ")
        else:
            seen.add(name)
            if len(seen) == len(FIELDS):
                self.complete += 1
                del self.expected[idx]

    async def consume(self, consumer: bf.Consumer, conn: int) -> None:
        try:
            async for ev in consumer:
                if isinstance(ev, bf.EntryReady):
                    self.on_entry(ev)
                elif isinstance(ev, bf.BlobAborted):
                    self.problems.append(f"connection {conn}: blob aborted: {ev.reason}")
        except bf.StreamError as e:
            self.problems.append(f"connection {conn}: {type(e).__name__}: {e}")
        finally:
            consumer.close()

    async def progress(self, start: float) -> None:
        tty = sys.stdout.isatty()
        while True:
            await asyncio.sleep(0.5)
            line = f"trainer: {self.complete}/{self.batch} samples, {self.entries} entries"
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)

    async def run(self, listener: bf.Listener, workers: int, timeout: float) -> bool:
        start = time.monotonic()
        shown = asyncio.create_task(self.progress(start))
        tasks = []
        try:
            for conn in range(workers):
                consumer = await asyncio.to_thread(listener.accept, timeout)
                tasks.append(asyncio.create_task(self.consume(consumer, conn)))
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                self.problems.append(f"timed out after {timeout} s")
        except bf.TimedOutError:
            self.problems.append(f"timed out after {timeout} s waiting for {workers} workers")
        finally:
            shown.cancel()
            for t in tasks:
                t.cancel()
        took = time.monotonic() - start
        if sys.stdout.isatty():
            print()
        print(f"trainer: {self.complete}/{self.batch} samples, {self.entries} entries, "
              f"{self.bytes / 1e6:.2f} MB in {took:.3f} s "
              f"({self.entries / took if took else 0:.0f} entries/s)")
        missing = self.batch - self.complete
        if missing:
            self.problems.append(f"{missing} sample(s) incomplete or missing")
        if self.problems:
            print("FAIL: samples are missing or differ")
            for p in self.problems[:20]:
                print("  " + p)
            return False
        print(f"OK: every sample arrived complete ({len(FIELDS)} keys) and identical to "
              "what its worker built")
        return True


def host_port(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"{text!r}: expected [HOST:]PORT")
    return (host.strip("[]") or default_host) if colon else default_host, int(port)


def url_of(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def endpoint(text: str, listening: bool) -> str:
    """A --listen/--connect value as a URL: a URL as it is (tcp://, ucx://,
    checked by blobpipe.parse_url), or [HOST:]PORT as tcp://. Raises
    ValueError (bf.URLError is one) with what is wrong."""
    if "://" in text:
        bf.parse_url(text, listening=listening)
        return text
    return url_of(*host_port(text))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4, help="worker connections (default 4)")
    ap.add_argument("--batch", type=int, default=256, help="samples in the batch (default 256)")
    side = ap.add_mutually_exclusive_group()
    side.add_argument("--listen", metavar="[HOST:]PORT|URL",
                      help="run only the trainer, listening there (PORT 0: a free one, named "
                           "in the first line)")
    side.add_argument("--connect", metavar="HOST:PORT|URL",
                      help="run only the workers, connecting there (to this trainer or the C++ "
                           "one; give both sides the same --workers and --batch)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="the trainer gives up after this many seconds (default 60)")
    a = ap.parse_args(argv)
    if a.workers < 1 or a.batch < 1 or not 0 < a.timeout <= 365 * 24 * 3600:
        ap.error("--workers and --batch must be >= 1, --timeout > 0")
    try:
        where = endpoint(a.listen or a.connect or "0", listening=not a.connect)
    except ValueError as e:
        ap.error(str(e))
    builder = SampleBuilder()

    if a.connect:
        print(f"rollout_to_trainer.py: {a.workers} worker(s) -> {where}", flush=True)
        return 0 if run_workers(where, a.workers, a.batch, builder) else 1

    try:
        listener = bf.listen(where, window_bytes=16 << 20)
    except (bf.URLError, bf.StreamError) as e:
        print(f"rollout_to_trainer.py: {e}", file=sys.stderr)
        return 2
    with listener:
        url = listener.url
        print(f"rollout_to_trainer.py: {a.workers} worker(s) -> trainer, {url}, "
              f"global batch {a.batch} samples (5 entries each)", flush=True)
        workers = None
        if not a.listen:  # both sides here: the workers on threads
            workers = threading.Thread(target=lambda: setattr(
                workers, "ok", run_workers(url, a.workers, a.batch, builder)))
            workers.start()
        trainer = Trainer(builder, a.batch)
        try:
            ok = asyncio.run(trainer.run(listener, a.workers, a.timeout))
        except KeyboardInterrupt:
            print(f"\ntrainer: interrupted with {trainer.complete}/{a.batch} samples")
            return 130
        if workers is not None:
            workers.join()
            ok = ok and getattr(workers, "ok", False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
