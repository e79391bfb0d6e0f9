"""bench/python_stream.py — streaming from Python against the C++ pipeline,
each run with its sender and its consumer in two processes over TCP
loopback, as rollout workers and trainers run (bench/python_bench.py's
section [3]; runs on its own too):

    bazel/bazelw run -c opt --symlink_prefix=/ //bench:python_bench -- --only stream

Rows (the public API on both sides, default options):

- 64 B: 200,000 uint8[64] torch tensors in blobs of 1,000; entries/s.
  Python sends them with Blob.emit one by one, and with Blob.emit_many.
- RL sample: one blob per sample, 5 entries: int64[2048] input ids,
  float32[2048] log-probs, bool[2048] token mask, a float32 scalar reward,
  a small dict (pickled); 20,000 samples; samples/s. Python sends each
  with Sender.send_blob (one call per sample) and with open_blob, emit x 5,
  finish.
- 16 MiB: 64 float32 tensors of 16 MiB, one per blob; GB/s (10^9 bytes).
  torch tensors (copied by emit: torch 1.13 may reallocate any tensor's
  bytes), torch tensors with emit(copy=False) (sent from their own memory:
  the caller's promise not to reallocate them) and numpy arrays (sent from
  their own memory).

The C++ rows stream the same entries (bytes, dtypes, shapes, keys; the
pickle's bytes) with blobpipe::sender and blobpipe::consumer
(_blobpipe._cpp_stream_send / _cpp_stream_consume). A run's time is the
consumer's last BlobComplete minus the sender's first emit, both
time.monotonic(), which the two processes share. The consumer process also
reports its CPU seconds (user + system) per entry: the consumer's per-event
cost, Python iterating `for ev in consumer` (and reading ev.value when
--touch) against the C++ consumer's next(); and the sender process's CPU
seconds per entry (all its threads, its I/O thread included), from before
connecting to the consumer's last message; each CPU figure is the least
of the runs. Each rate is the best of --reps runs, Python and C++
interleaved; the spread (worst/best) is printed.

pyzmq rows (when pyzmq is importable; else one "SKIP" line per row): the
same entries from the same torch tensors, PUSH (this process, connecting)
to PULL (the consumer process, bound), as a Python user of pyzmq would
write it. pyzmq carries no dtypes or shapes (and for RL samples no keys):
its receiver knows the schema, and rebuilds each value with
torch.frombuffer (dtype, and reshape(()) for the scalar) and pickle.loads,
as a trainer would. Each row is set beside the blobpipe Python runs whose
consumer reads ev.value (the tensor, or the unpickled dict), so both
receivers build every value (the "+value" lines); the ratio printed is
blobpipe Python over pyzmq.

- 64 B, "send": one message per entry, [key.encode(), t.numpy()]
  (send_multipart, which copies); beside `emit`. "send_multipart x1000":
  one message per blob, [k0, v0, k1, v1, ...] (2,000 frames); beside
  `emit_many`. The receiver copies (recv_multipart()).
- RL sample: one message per sample, [ids, logprobs, mask, reward,
  pickle.dumps(meta)] (each tensor's t.numpy(), copied by
  send_multipart); beside `send_blob` and open/emit/finish. The receiver
  copies (recv_multipart(), pyzmq's default; no frame is over 16 KiB).
- 16 MiB: one message per tensor, [key.encode(), t.numpy()], copy=False
  (pyzmq holds the buffer and sends from it) and copy=True; the receiver
  takes frames without a copy (recv_multipart(copy=False), frame.buffer).
  Beside blobpipe's emit(copy=False), and its default emit (copying)
  beside copy=True.

pyzmq's high-water marks (SNDHWM and RCVHWM, in messages) hold at least
64 MiB of the row's messages (blobpipe's default window and send queue),
and never less than pyzmq's default of 1,000: 64 B per entry 1,048,576
(never reached), 64 B batched 1,049, RL 2,513, 16 MiB 1,000 (the pyzmq
lines print them). A run starts after one message has gone through
(blobpipe's connect() returns after the consumer's handshake too) and
ends at the consumer's last message.

Last, one process: a sender thread streaming RL samples (emit one by one)
to a consumer iterating in the same process with Python work per event;
it prints the worst and the 99.9th-percentile single emit (the GIL the
two threads share) and the emits that waited on a full queue.

Exits 0 whatever the figures: a benchmark reports, it never gates.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time

import numpy as np
import torch

import blobpipe as bf

MIB = 1 << 20

try:  # only the pyzmq rows need it; without it they print SKIP
    import zmq
except ImportError:
    zmq = None


# ---- workloads: (blobs, [(key, value)]) ------------------------------------

def rows(quick: bool) -> list[dict]:
    small_blobs, rl_samples, big = (200, 20_000, 64) if not quick else (4, 200, 2)
    meta = {"idx": 7, "group": 3, "prompt_len": 512, "source": "gsm8k", "spans": [(3, 9)]}
    rl = [("0@input_ids", torch.arange(2048, dtype=torch.int64)),
          ("0@generation_logprobs", torch.linspace(-3, 0, 2048, dtype=torch.float32)),
          ("0@token_mask", torch.arange(2048) % 3 != 0),
          ("0@reward", torch.tensor(0.5)),
          ("0@meta", meta)]
    small = [(f"e{i}", torch.full((64,), i % 251, dtype=torch.uint8)) for i in range(1000)]
    big_t = torch.rand(4 * MIB)
    # "zmq": the pyzmq ways; "vs": (blobpipe Python way, pyzmq way) pairs,
    # each printed as a ratio.
    return [
        {"name": "64 B", "unit": "entries/s", "blobs": small_blobs, "entries": small,
         "ways": ["emit", "emit_many"],
         "zmq": ["send", "send_multipart x1000"],
         "vs": [("emit", "send"), ("emit_many", "send_multipart x1000")]},
        {"name": "RL sample", "unit": "samples/s", "blobs": rl_samples, "entries": rl,
         "ways": ["send_blob", "emit"],
         "zmq": ["send_multipart"],
         "vs": [("send_blob", "send_multipart"), ("emit", "send_multipart")]},
        {"name": "16 MiB", "unit": "GB/s", "blobs": big, "entries": [("x", big_t)],
         "ways": ["emit", "emit copy=False", "emit numpy"],
         "zmq": ["copy=False", "copy=True"],
         "vs": [("emit copy=False", "copy=False"), ("emit copy=False", "copy=True"),
                ("emit", "copy=True")]},
    ]


def cpp_spec(entries) -> list:
    """The entries as _cpp_stream_send takes them: (key, kind, dtype, shape, bytes)."""
    plan = bf.plan([k for k, _ in entries], [v for _, v in entries])
    out = []
    for (key, v), e in zip(entries, plan.entries):
        if e.kind == "p":
            import pickle
            data = pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            data = v.numpy().reshape(-1).view(np.uint8) if isinstance(v, torch.Tensor) else v
        out.append((key, e.kind, e.dtype or "", list(e.shape or ()), data))
    return out


# ---- the two halves --------------------------------------------------------

def send_python(port: int, row: dict, way: str) -> float:
    """Streams the row from this process; returns the first emit's time."""
    entries = row["entries"]
    if way == "emit numpy":
        entries = [(k, v.numpy()) for k, v in entries]
    keys, values = [k for k, _ in entries], [v for _, v in entries]
    sender = bf.connect(f"tcp://127.0.0.1:{port}")
    start = time.monotonic()
    if way == "send_blob":
        for _ in range(row["blobs"]):
            sender.send_blob(keys, values)
    elif way == "emit_many":
        for _ in range(row["blobs"]):
            blob = sender.open_blob()
            blob.emit_many(keys, values)
            blob.finish()
    elif way == "emit copy=False":
        for _ in range(row["blobs"]):
            blob = sender.open_blob()
            for k, v in entries:
                blob.emit(k, v, copy=False)
            blob.finish()
    else:
        for _ in range(row["blobs"]):
            blob = sender.open_blob()
            for k, v in entries:
                blob.emit(k, v)
            blob.finish()
    sender.shutdown()
    return start


def consume_python(touch: bool) -> dict:
    with bf.listen("tcp://127.0.0.1:0") as listener:
        print(json.dumps({"port": listener.port}), flush=True)
        consumer = listener.accept(timeout=60)
        cpu0 = time.process_time()
        entries = blobs = 0
        end = 0.0
        with consumer:
            for ev in consumer:
                t = type(ev)
                if t is bf.EntryReady:
                    entries += 1
                    if touch:
                        ev.value
                elif t is bf.BlobComplete:
                    blobs += 1
                    end = time.monotonic()
                else:
                    raise RuntimeError(f"unexpected event {ev!r}")
        return {"entries": entries, "blobs": blobs, "end": end,
                "cpu": time.process_time() - cpu0}


# ---- pyzmq ----------------------------------------------------------------

ZMQ_LAYOUT = {"send": "entry", "send_multipart x1000": "batch", "send_multipart": "rl",
              "copy=False": "big", "copy=True": "big"}


def zmq_messages(row: dict, zway: str) -> int:
    return row["blobs"] * (len(row["entries"]) if ZMQ_LAYOUT[zway] == "entry" else 1)


def zmq_hwm(row: dict, zway: str) -> int:
    """At least 64 MiB of the row's messages, blobpipe's default window and
    send queue, so pyzmq never waits where blobpipe would not; never below
    pyzmq's default of 1,000."""
    payload = row["blobs"] * sum(
        len(pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)) if not isinstance(v, torch.Tensor)
        else v.numel() * v.element_size() for _, v in row["entries"])
    return max(1000, -(-64 * MIB * zmq_messages(row, zway) // payload))


def send_zmq(port: int, row: dict, zway: str, child) -> tuple[float, dict]:
    """Streams the row with a PUSH socket; returns the first send's time and
    the consumer's result.
    One message goes through first, and the consumer says so on its stdout
    (as blobpipe's connect() returns after the consumer's handshake)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, zmq_hwm(row, zway))
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        sock.send(b"hello")
        json.loads(child.stdout.readline())  # {"ready": true}
        entries, layout = row["entries"], ZMQ_LAYOUT[zway]
        start = time.monotonic()
        if layout == "entry":
            for _ in range(row["blobs"]):
                for k, v in entries:
                    sock.send_multipart([k.encode(), v.numpy()])
        elif layout == "batch":
            for _ in range(row["blobs"]):
                frames = []
                for k, v in entries:
                    frames += (k.encode(), v.numpy())
                sock.send_multipart(frames)
        elif layout == "rl":
            (_, ids), (_, lp), (_, mask), (_, reward), (_, meta) = entries
            for _ in range(row["blobs"]):
                sock.send_multipart([ids.numpy(), lp.numpy(), mask.numpy(), reward.numpy(),
                                     pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)])
        else:
            copy = zway == "copy=True"
            for _ in range(row["blobs"]):
                for k, v in entries:
                    sock.send_multipart([k.encode(), v.numpy()], copy=copy)
        result = json.loads(child.stdout.readline())
    finally:
        sock.close(linger=0)  # the consumer has had every message, or failed
        ctx.term()
    return start, result


def consume_zmq(layout: str, messages: int, hwm: int) -> dict:
    """Receives `messages` messages of `layout` (ZMQ_LAYOUT), rebuilding
    each value as a trainer would: torch.frombuffer with the dtype its
    schema says, reshape(()) for the 0-d reward, pickle.loads for the
    dict."""
    import warnings
    # frombuffer of bytes (read-only) warns once; the values are only read
    warnings.filterwarnings("ignore", message="The given buffer is not writable")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, hwm)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"port": port}), flush=True)
    sock.recv()  # the sender's first message: connected
    print(json.dumps({"ready": True}), flush=True)
    cpu0 = time.process_time()
    entries = 0
    frombuffer, u8, f32, i64, b = torch.frombuffer, torch.uint8, torch.float32, torch.int64, torch.bool
    recv = sock.recv_multipart
    if layout == "entry":
        for _ in range(messages):
            f = recv()
            frombuffer(f[1], dtype=u8)
        entries = messages
    elif layout == "batch":
        for _ in range(messages):
            f = recv()
            for i in range(1, len(f), 2):
                frombuffer(f[i], dtype=u8)
            entries += len(f) // 2
    elif layout == "rl":
        loads = pickle.loads
        for _ in range(messages):
            ids, lp, mask, reward, meta = recv()
            frombuffer(ids, dtype=i64)
            frombuffer(lp, dtype=f32)
            frombuffer(mask, dtype=b)
            frombuffer(reward, dtype=f32).reshape(())
            loads(meta)
        entries = messages * 5
    else:
        for _ in range(messages):
            f = recv(copy=False)
            frombuffer(f[1].buffer, dtype=f32)
        entries = messages
    end = time.monotonic()
    cpu = time.process_time() - cpu0
    sock.close()
    ctx.term()
    return {"entries": entries, "messages": messages, "end": end, "cpu": cpu}


def consume_cpp() -> dict:
    cpu0 = time.process_time()
    entries, blobs, end = bf._blobpipe._cpp_stream_consume(
        lambda port: print(json.dumps({"port": port}), flush=True))
    return {"entries": entries, "blobs": blobs, "end": end, "cpu": time.process_time() - cpu0}


def run_once(row: dict, impl: str, way: str, touch: bool) -> dict:
    """One run: a consumer child process, this process sending."""
    cmd = [sys.executable, os.path.abspath(__file__), "--consume", impl]
    if touch:
        cmd.append("--touch")
    if impl == "zmq":
        cmd += ["--zmq-layout", ZMQ_LAYOUT[way], "--zmq-messages", str(zmq_messages(row, way)),
                "--zmq-hwm", str(zmq_hwm(row, way))]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(child.stdout.readline())["port"]
        sender_cpu0 = time.process_time()
        if impl == "zmq":
            start, result = send_zmq(port, row, way, child)
        else:
            if impl == "cpp":
                start = bf._blobpipe._cpp_stream_send(port, row["blobs"], cpp_spec(row["entries"]))
            else:
                start = send_python(port, row, way)
            result = json.loads(child.stdout.readline())
        result["sender_cpu"] = time.process_time() - sender_cpu0
    except BaseException:
        child.kill()  # it may wait for a sender that never comes
        raise
    finally:
        child.stdout.close()
    if child.wait(timeout=120) != 0:
        raise RuntimeError(f"consumer process exited {child.returncode}")
    n = row["blobs"] * len(row["entries"])
    if impl == "zmq":
        result["blobs"] = row["blobs"]  # no blobs in pyzmq: the consumer counted the values
    if (result["entries"], result["blobs"]) != (n, row["blobs"]):
        raise RuntimeError(f"received {result['entries']} entries in {result['blobs']} blobs, "
                           f"sent {n} in {row['blobs']}")
    result["seconds"] = result["end"] - start
    return result


def rate(row: dict, seconds: float) -> float:
    if row["unit"] == "GB/s":
        return row["blobs"] * sum(v.numel() * v.element_size() for _, v in row["entries"]) / seconds / 1e9
    count = row["blobs"] * (len(row["entries"]) if row["unit"] == "entries/s" else 1)
    return count / seconds


def bench(quick: bool, reps: int, touch: bool) -> list[dict]:
    """Prints the table; returns its rows (name, way, python, cpp, ratio)
    and, per pyzmq pair, (name, way, pyzmq_way, python, pyzmq, ratio_pyzmq)."""
    print(f"[3] streaming over TCP 127.0.0.1, sender and consumer in two processes, "
          f"Python against C++ and pyzmq, best of {reps} (spread worst/best)"
          + (", the Python consumer reading ev.value" if touch else ""))
    if zmq is None:
        print("    pyzmq rows: SKIP: pyzmq not installed (Debian's python3-zmq; bazel/bazelw installs it)")
    else:
        print(f"    pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}) rows beside blobpipe Python runs "
              f"whose consumer reads ev.value, as pyzmq's receiver builds each value; "
              f"ratio = blobpipe Python / pyzmq")
    out = []
    for row in rows(quick):
        # (impl, way, the Python consumer reads ev.value)
        runs: dict = {("cpp", "", False): []}
        for way in row["ways"]:
            runs[("py", way, touch)] = []
        if zmq is not None:
            for way, _ in row["vs"]:
                runs[("py", way, True)] = []
            for zway in row["zmq"]:
                runs[("zmq", zway, True)] = []
        for _ in range(reps):  # interleaved
            for impl, way, value in runs:
                runs[(impl, way, value)].append(run_once(row, impl, way, value))
        per_entry = row["blobs"] * len(row["entries"])

        def best(rs):
            fast = min(r["seconds"] for r in rs)
            return rate(row, fast), max(r["seconds"] for r in rs) / fast, \
                min(r["cpu"] for r in rs) / per_entry * 1e6

        def sender_cpu(rs):
            return f"  sender {min(r['sender_cpu'] for r in rs) / per_entry * 1e6:7.2f}"

        cpp, cpp_spread, cpp_cpu = best(runs[("cpp", "", False)])
        print(f"    {row['name']:9} C++ {'':26} {cpp:12,.2f} {row['unit']:9} spread {cpp_spread:4.2f}"
              f"  consumer {cpp_cpu:6.2f}{sender_cpu(runs[('cpp', '', False)])} us CPU/entry")
        for way in row["ways"]:
            py, spread, cpu = best(runs[("py", way, touch)])
            print(f"    {row['name']:9} Python {way:23} {py:12,.2f} {row['unit']:9} spread {spread:4.2f}"
                  f"  consumer {cpu:6.2f}{sender_cpu(runs[('py', way, touch)])} us CPU/entry"
                  f"   {py / cpp:5.2f}x C++")
            out.append({"row": row["name"], "way": way, "python": py, "cpp": cpp,
                        "ratio": py / cpp, "unit": row["unit"]})
        if zmq is None:
            print(f"    {row['name']:9} pyzmq: SKIP: pyzmq not installed")
            continue
        for zway in row["zmq"]:
            z, spread, cpu = best(runs[("zmq", zway, True)])
            print(f"    {row['name']:9} pyzmq {zway:24} {z:12,.2f} {row['unit']:9} spread {spread:4.2f}"
                  f"  consumer {cpu:6.2f}{sender_cpu(runs[('zmq', zway, True)])} us CPU/entry"
                  f"   HWM {zmq_hwm(row, zway):,}")
        for way in dict.fromkeys(w for w, _ in row["vs"]):
            py, spread, cpu = best(runs[("py", way, True)])
            print(f"    {row['name']:9} Python {way + ' +value':23} {py:12,.2f} {row['unit']:9} "
                  f"spread {spread:4.2f}  consumer {cpu:6.2f}{sender_cpu(runs[('py', way, True)])}"
                  f" us CPU/entry   {py / cpp:5.2f}x C++")
        for way, zway in row["vs"]:
            py = best(runs[("py", way, True)])[0]
            z = best(runs[("zmq", zway, True)])[0]
            print(f"    {row['name']:9} ratio: Python {way} / pyzmq {zway}: {py / z:5.2f}x")
            out.append({"row": row["name"], "way": way, "pyzmq_way": zway, "python": py,
                        "pyzmq": z, "ratio_pyzmq": py / z, "unit": row["unit"]})
    return out


def bench_shared_process(quick: bool) -> dict:
    """RL samples from a sender thread to a consumer iterating in the same
    process, the consumer doing Python work per event (reading ev.value and
    summing a few elements, as a trainer's loop would): the worst and the
    99.9th-percentile single emit, and how many emits waited on a full
    queue (those wait by design: backpressure)."""
    import threading
    samples = 200 if quick else 20_000
    entries = rows(quick)[1]["entries"]
    with bf.listen("tcp://127.0.0.1:0") as listener:
        box: dict = {}
        acc = threading.Thread(target=lambda: box.setdefault("c", listener.accept(timeout=60)))
        acc.start()
        sender = bf.connect(f"tcp://127.0.0.1:{listener.port}")
        acc.join()
        emits: list[float] = []

        def produce() -> None:
            for _ in range(samples):
                blob = sender.open_blob()
                for k, v in entries:
                    t0 = time.perf_counter()
                    blob.emit(k, v)
                    emits.append(time.perf_counter() - t0)
                blob.finish()
            box["stats"] = sender.stats()
            sender.shutdown()

        tx = threading.Thread(target=produce)
        start = time.perf_counter()
        tx.start()
        acc_sum = 0.0
        with box["c"] as consumer:
            for ev in consumer:
                if type(ev) is bf.EntryReady:
                    v = ev.value
                    if isinstance(v, torch.Tensor) and v.numel():
                        acc_sum += float(v.reshape(-1)[0])
        tx.join()
        seconds = time.perf_counter() - start
    emits.sort()
    out = {"samples/s": samples / seconds, "worst_ms": emits[-1] * 1e3,
           "p999_ms": emits[int(len(emits) * 0.999)] * 1e3,
           "queue_waits": box["stats"]["queue_waits"]}
    print(f"    RL sample, consumer thread in the sender's process: {out['samples/s']:,.0f} samples/s,"
          f" worst emit {out['worst_ms']:.2f} ms, p99.9 {out['p999_ms']:.3f} ms,"
          f" emits that waited on a full queue: {out['queue_waits']}   target worst <= 10 ms")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: checks that it runs")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--touch", action="store_true", help="the Python consumer reads ev.value")
    ap.add_argument("--consume", choices=["py", "cpp", "zmq"], help=argparse.SUPPRESS)
    ap.add_argument("--zmq-layout", choices=sorted(set(ZMQ_LAYOUT.values())), help=argparse.SUPPRESS)
    ap.add_argument("--zmq-messages", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--zmq-hwm", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.consume:
        if args.consume == "zmq":
            r = consume_zmq(args.zmq_layout, args.zmq_messages, args.zmq_hwm)
        else:
            r = consume_cpp() if args.consume == "cpp" else consume_python(args.touch)
        print(json.dumps(r), flush=True)
        return 0
    bench(args.quick, 1 if args.quick else args.reps, args.touch)
    bench_shared_process(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
