"""bench/python_bench.py — the Python package's codec against the reference
codec and numpy, and its streaming classes against the C++ pipeline.

    bazel/bazelw run -c opt --symlink_prefix=/ //bench:python_bench
    bazel/bazelw run -c opt --symlink_prefix=/ //bench:python_bench -- --quick
    bazel/bazelw run -c opt --symlink_prefix=/ //bench:python_bench -- --only stream

One run prints, side by side:

1. plan()+write() from Python: one blob of 10,000 float32[16] torch tensors
   per iteration (keys "<i>@x"), into a buffer allocated once; entries/s,
   best of as many iterations as fit in about 3 s (at least 5), with
   gc.collect() before each. The same for the reference codec
   (nemo_rl.data_plane.nixl.blob_format) when it can be imported: from
   $BLOBPIPE_REFERENCE (a path to its blob_format.py) or from nemo_rl on
   the path; it needs torch, numpy and msgspec (Debian 12 has no msgspec).
   msgspec missing (Debian 12) is shimmed onto python3-msgpack here.
   Otherwise its row says why it was skipped. Targets: >= 1,000,000
   entries/s, and >= 15x the reference in the same run. blobpipe's time
   does not include BlobPlan.buffers/keepalive, built on first read.
1b. read_index, decode_entry (torch, numpy, pickle), decode_entries and
   materialize over blobs of 10,000 entries, each interleaved with the
   reference (best of 5, worst shown), with the decode overhead above a
   bare torch.frombuffer(...).view(shape). Targets: read_index >= 3x,
   decode_entry >= 1x and <= 0.3 us above the bare call, decode_entries
   >= 2x the reference's loop, materialize >= 1x.
1c. NeMo RL's storage-client pattern, put (plan, plan.buffers and
   plan.keepalive, small values packed at their planned offsets, large
   ones kept for a zero-copy send, write_tail) and get (read_index,
   decode_entry, materialize), 64 RL samples of 4,096 tokens, one blob
   each, interleaved with the reference (best of 5), and the floor: the
   client's own packing loop alone. Targets: put >= 3x, get >= 1.5x.
2. write() of 8 x 64 MiB float32 tensors into one blob against numpy
   copying the same bytes to the same offsets of the same (pre-faulted)
   buffer; GB/s, best of 5, interleaved. Target: >= 0.8x the copy.

3. Streaming, Python against the C++ pipeline and against pyzmq
   (PUSH/PULL, when installed), each with its sender and its consumer in
   two processes over TCP loopback: 64 B entries, RL samples, 16 MiB
   tensors (bench/python_stream.py, which says how).

Prints PASS/MISS against each target but exits 0 whatever the numbers: a
benchmark reports, it never gates. --quick runs small sizes (a check that
the benchmark works, not figures). Peak memory about 1.1 GiB (sources, one
blob buffer; streaming adds the 64 MiB window and a 16 MiB source).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import time

import numpy as np
import torch

import blobpipe as bf

# The msgspec shim the reference needs here, shared with the tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
from reference_shim import shim_msgspec  # noqa: E402

MIB = 1 << 20


def load_reference():
    """(module, None), or (None, why it cannot be imported)."""
    path = os.environ.get("BLOBPIPE_REFERENCE")
    try:
        shim_msgspec()
        if path:
            spec = importlib.util.spec_from_file_location("reference_blob_format", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod  # its dataclasses look themselves up there
            spec.loader.exec_module(mod)
            return mod, None
        from nemo_rl.data_plane.nixl import blob_format
        return blob_format, None
    except Exception as ex:  # any failure to import means: no reference row
        return None, f"{type(ex).__name__}: {ex}"


def best_time(fn, budget_s: float, min_reps: int) -> float:
    """Best wall time of fn() over at least min_reps runs and about budget_s."""
    best, spent, reps = float("inf"), 0.0, 0
    while reps < min_reps or spent < budget_s:
        gc.collect()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, reps = min(best, dt), spent + dt, reps + 1
    return best


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def bench_small(codec, entries: int, budget_s: float, min_reps: int) -> float:
    """entries/s of codec.plan()+codec.write() for `entries` float32[16] tensors."""
    keys = [f"{i}@x" for i in range(entries)]
    values = [torch.randn(16) for _ in range(entries)]
    out = memoryview(np.empty(codec.plan(keys, values).nbytes, dtype=np.uint8))
    return entries / best_time(lambda: codec.write(codec.plan(keys, values), out), budget_s, min_reps)


def bench_plan_write(args, ref, why) -> None:
    print(f"[1] plan+write from Python: {args.entries} x float32[16] torch tensors per blob")
    ours = bench_small(bf, args.entries, args.budget, args.min_reps)
    print(f"    blobpipe        {ours:12,.0f} entries/s   target >= 1,000,000: {verdict(ours >= 1e6)}")
    if ref is None:
        print(f"    reference       skipped: cannot import the reference codec ({why})")
        print("                    set BLOBPIPE_REFERENCE=/path/to/blob_format.py")
        return
    theirs = bench_small(ref, args.entries, args.budget, args.min_reps)
    print(f"    reference       {theirs:12,.0f} entries/s")
    ok = ours >= 15 * theirs
    print(f"    ratio           {ours / theirs:12.1f}x          target >= 15x: {verdict(ok)}")


def codec_blob(codec, kind: str, n: int):
    """(blob as a memoryview, its entries by codec.read_index) of n entries of
    one kind: 't' float32[16] tensors, 'n' float32[16] arrays, 'p' small
    dicts (pickled)."""
    keys = [f"{i}@x" for i in range(n)]
    if kind == "t":
        values = [torch.full((16,), float(i)) for i in range(n)]
    elif kind == "n":
        values = [np.full(16, i, dtype=np.float32) for i in range(n)]
    else:
        values = [{"idx": i, "reward": 0.5} for i in range(n)]
    p = codec.plan(keys, values)
    out = memoryview(np.zeros(p.nbytes, dtype=np.uint8))
    codec.write(p, out)
    return out, codec.read_index(out)


def spread(times: list[float]) -> str:
    return f"best {min(times) * 1e3:.2f} ms, worst {max(times) * 1e3:.2f} ms"


def timed(fn, reps: int) -> list[float]:
    """Wall times of reps calls of fn(), gc.collect() before each."""
    out = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def compare(name: str, n: int, ours_fn, ref_fn, reps: int, target: float, unit: str = "call"):
    """Times both sides interleaved (best of reps each), prints µs per
    `unit`, the ratio reference/blobpipe and the verdict against `target`."""
    ours_t, ref_t = [], []
    for _ in range(reps):  # interleaved: both see the same machine
        ours_t += timed(ours_fn, 1)
        if ref_fn is not None:
            ref_t += timed(ref_fn, 1)
    ours = min(ours_t)
    line = f"    {name:28} blobpipe {ours / n * 1e6:7.3f} µs/{unit} ({spread(ours_t)})"
    if ref_fn is None:
        print(line + "   reference: skipped")
        return None
    theirs = min(ref_t)
    ratio = theirs / ours
    print(line)
    print(f"    {'':28} reference {theirs / n * 1e6:6.3f} µs/{unit} ({spread(ref_t)})"
          f"   ratio {ratio:5.2f}x   target >= {target:g}x: {verdict(ratio >= target)}")
    return ratio


def bench_decode(args, ref) -> None:
    """read_index, decode_entry per kind, the batched decode and materialize,
    each against the reference in the same run."""
    n, reps = args.decode_entries, args.decode_reps
    print(f"[1b] read / decode / materialize: {n:,} entries per blob, best of {reps}, interleaved")
    for kind, label in (("t", "torch float32[16]"), ("n", "numpy <f4[16]"), ("p", "pickle (dict)")):
        blob, entries = codec_blob(bf, kind, n)
        views = [blob[e.off: e.off + e.len] for e in entries]
        ref_entries = ref_views = None
        if ref is not None:
            rblob, ref_entries = codec_blob(ref, kind, n)
            ref_views = [rblob[e.off: e.off + e.len] for e in ref_entries]
            assert bytes(rblob) == bytes(blob), "the reference wrote other bytes"
        if kind == "t":
            compare("read_index", n, lambda: bf.read_index(blob),
                    ref and (lambda: ref.read_index(rblob)), reps, 3, "entry")
        dec = bf.decode_entry
        ours = lambda: [dec(v, e) for v, e in zip(views, entries)]  # noqa: E731
        theirs = None
        if ref is not None:
            rdec = ref.decode_entry
            theirs = lambda: [rdec(v, e) for v, e in zip(ref_views, ref_entries)]  # noqa: E731
        compare(f"decode_entry {label}", n, ours, theirs, reps, 1)
        if kind == "t":
            dt, shape = torch.float32, (16,)
            frombuffer = torch.frombuffer
            bare_t, ours_t = [], []
            for _ in range(reps):  # interleaved, as compare()
                bare_t += timed(lambda: [frombuffer(v, dtype=dt).view(shape) for v in views], 1)
                ours_t += timed(ours, 1)
            over = (min(ours_t) - min(bare_t)) / n * 1e6
            print(f"    {'':28} bare torch.frombuffer(v, dtype=dt).view(shape) "
                  f"{min(bare_t) / n * 1e6:6.3f} µs/call; overhead {over:6.3f} µs/call"
                  f"   target <= 0.3: {verdict(over <= 0.3)}")
        if hasattr(bf, "decode_entries"):  # blobpipe's batched call (absent from older builds)
            theirs = None
            if ref is not None:
                theirs = lambda: [rdec(rblob[e.off: e.off + e.len], e) for e in ref_entries]  # noqa: E731
            compare(f"decode_entries {label}", n, lambda: bf.decode_entries(blob, entries),
                    theirs, reps, 2, "entry")
        if kind == "t":
            vals = ours()
            m = bf.materialize
            theirs = None
            if ref is not None:
                rvals, rm = [rdec(v, e) for v, e in zip(ref_views, ref_entries)], ref.materialize
                theirs = lambda: [rm(v) for v in rvals]  # noqa: E731
            compare("materialize torch", n, lambda: [m(v) for v in vals], theirs, reps, 1)


def rl_samples(n: int, tokens: int):
    """n RL samples as (keys, values): token ids, log-probs, mask, reward and
    a meta dict, as the example's workers make them."""
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(n):
        keys = [f"{i}@input_ids", f"{i}@generation_logprobs", f"{i}@token_mask", f"{i}@reward",
                f"{i}@meta"]
        values = [torch.randint(0, 32000, (tokens,), generator=g),
                  torch.randn(tokens, generator=g),
                  torch.ones(tokens, dtype=torch.bool),
                  torch.tensor(0.5),
                  {"idx": i, "group": i // 4, "source": "bench"}]
        out.append((keys, values))
    return out


def client_put(codec, keys, values, threshold: int = 64 << 10):
    """NeMo RL's storage-client put, as it uses the codec: plan, then each
    value's bytes from plan.buffers (held by plan.keepalive) either packed
    into a staging buffer at its planned (_align_up) offset or, from
    `threshold` bytes, kept to be sent zero-copy; then write_tail into the
    staging buffer's tail."""
    p = codec.plan(keys, values)
    staging = np.empty(p.nbytes, dtype=np.uint8)
    large = []
    for e, mv, keep in zip(p.entries, p.buffers, p.keepalive):
        if e.len >= threshold:
            large.append((e.off, mv, keep))
        elif e.len:
            staging[e.off: e.off + e.len] = np.frombuffer(mv, dtype=np.uint8)
    codec.write_tail(p, memoryview(staging)[p.index_off:])
    return staging, large


def client_get(codec, staging):
    """The read-back: read_index, decode_entry of each entry, materialize."""
    blob = memoryview(staging)
    return [codec.materialize(codec.decode_entry(blob[e.off: e.off + e.len], e))
            for e in codec.read_index(blob)]


def bench_client(args, ref) -> None:
    """The storage client's put and get over 64 RL samples of 4,096 tokens,
    one blob per sample, against the reference (interleaved, best of reps),
    and the floor: the client's own loop alone (packing from buffers made
    beforehand, no plan, no write_tail)."""
    n, tokens, reps = args.client_samples, args.client_tokens, args.reps
    samples = rl_samples(n, tokens)
    print(f"[1c] NeMo storage client: {n} RL samples of {tokens} tokens, one blob each, "
          f"best of {reps}, interleaved")
    put = lambda codec: [client_put(codec, k, v) for k, v in samples]  # noqa: E731
    compare("client put", n, lambda: put(bf), ref and (lambda: put(ref)), reps, 3, "sample")
    planned = [bf.plan(k, v) for k, v in samples]
    made = [(p, p.nbytes, list(zip(p.entries, p.buffers))) for p in planned]

    def own_loop():
        for p, nbytes, rows in made:
            staging = np.empty(nbytes, dtype=np.uint8)
            for e, mv in rows:
                if e.len:
                    staging[e.off: e.off + e.len] = np.frombuffer(mv, dtype=np.uint8)

    floor = min(timed(own_loop, reps))
    print(f"    {'':28} floor (the client's own packing loop) {floor / n * 1e6:7.3f} µs/sample")
    stagings = [client_put(bf, k, v)[0] for k, v in samples]
    get = lambda codec: [client_get(codec, s) for s in stagings]  # noqa: E731
    compare("client get", n, lambda: get(bf), ref and (lambda: get(ref)), reps, 1.5, "sample")
    if ref is None:
        return
    # On a loaded machine a timing of 64 samples is preempted more often
    # than not: each sample alone, 15 times, interleaved; the sum of the
    # per-sample minima.
    ref_stagings = [client_put(ref, k, v)[0] for k, v in samples]
    for name, ours_fn, ref_fn in (
            ("put", lambda i: client_put(bf, *samples[i]), lambda i: client_put(ref, *samples[i])),
            ("get", lambda i: client_get(bf, stagings[i]), lambda i: client_get(ref, ref_stagings[i]))):
        ours_t, ref_t = [float("inf")] * n, [float("inf")] * n
        for _ in range(15):
            for i in range(n):
                ours_t[i] = min(ours_t[i], timed(lambda: ours_fn(i), 1)[0])
                ref_t[i] = min(ref_t[i], timed(lambda: ref_fn(i), 1)[0])
        print(f"    {'client ' + name + ', per sample':28} blobpipe {sum(ours_t) / n * 1e6:7.3f} µs, "
              f"reference {sum(ref_t) / n * 1e6:7.3f} µs (best of 15 each)   "
              f"ratio {sum(ref_t) / sum(ours_t):5.2f}x")


def per_call(name: str, unit: str, count: int, calls, rounds: int = 15) -> tuple[float, float]:
    """Each of `calls` ((ours, theirs) zero-argument pairs) timed alone,
    blobpipe and the reference interleaved call by call, `rounds` times;
    prints and returns the sums of the per-call minima (seconds) over
    `count` units."""
    ours_t, ref_t = [float("inf")] * len(calls), [float("inf")] * len(calls)
    clock = time.perf_counter
    for _ in range(rounds):
        for i, (ours, theirs) in enumerate(calls):
            t0 = clock()
            ours()
            t1 = clock()
            theirs()
            t2 = clock()
            ours_t[i], ref_t[i] = min(ours_t[i], t1 - t0), min(ref_t[i], t2 - t1)
    a, b = sum(ours_t), sum(ref_t)
    print(f"    {name:36} blobpipe {a / count * 1e6:7.3f} µs/{unit}, reference "
          f"{b / count * 1e6:7.3f} µs/{unit}   ratio {b / a:5.2f}x")
    return a, b


def bench_per_call(args, ref) -> None:
    """--only percall: the storage client's put and get, read_index and
    plan+write, each call timed alone (per-call minima summed), for a
    loaded machine, where a timing of many calls is preempted more often
    than not; then where blobpipe's put and get go."""
    if ref is None:
        print("[percall] SKIP: no reference")
        return
    n, tokens = args.client_samples, args.client_tokens
    samples = rl_samples(n, tokens)
    print(f"[percall] each call alone, blobpipe and the reference interleaved, minima summed "
          f"({n} RL samples of {tokens} tokens; 20 blobs of 100 float32[16])")
    gc.collect()
    gc.disable()  # a collection inside one timed call is noise, not cost
    try:
        ours_st = [client_put(bf, k, v)[0] for k, v in samples]
        ref_st = [client_put(ref, k, v)[0] for k, v in samples]
        per_call("client put, per sample", "sample", n,
                 [(lambda k=k, v=v: client_put(bf, k, v), lambda k=k, v=v: client_put(ref, k, v))
                  for k, v in samples])
        per_call("client get, per sample", "sample", n,
                 [(lambda s=s: client_get(bf, s), lambda r=r: client_get(ref, r))
                  for s, r in zip(ours_st, ref_st)])
        per_call("plan alone, per sample", "sample", n,
                 [(lambda k=k, v=v: bf.plan(k, v), lambda k=k, v=v: ref.plan(k, v))
                  for k, v in samples])
        blobs = []
        for b in range(20):
            keys = [f"{b}.{i}@x" for i in range(100)]
            values = [torch.full((16,), float(i)) for i in range(100)]
            out = memoryview(np.empty(bf.plan(keys, values).nbytes, dtype=np.uint8))
            rout = memoryview(np.empty(ref.plan(keys, values).nbytes, dtype=np.uint8))
            bf.write(bf.plan(keys, values), out)
            ref.write(ref.plan(keys, values), rout)
            blobs.append((keys, values, out, rout))
        per_call("read_index, per row (100-row blobs)", "row", 20 * 100,
                 [(lambda o=o: bf.read_index(o), lambda r=r: ref.read_index(r))
                  for _, _, o, r in blobs])
        per_call("plan+write, per entry (100 x f32[16])", "entry", 20 * 100,
                 [(lambda k=k, v=v, o=o: bf.write(bf.plan(k, v), o),
                   lambda k=k, v=v, r=r: ref.write(ref.plan(k, v), r))
                  for k, v, o, r in blobs])
        # Where blobpipe's put goes: each piece alone, minima summed.
        pieces = {"plan": [], "plan.entries": [], "plan.buffers+keepalive": [],
                  "staging np.empty+write_tail": [], "the client's packing loop": [],
                  "read_index": [], "slices+decode_entry": [], "materialize": []}
        clock = time.perf_counter
        threshold = 64 << 10
        for _ in range(15):
            for (k, v), s in zip(samples, ours_st):
                t0 = clock()
                p = bf.plan(k, v)
                t1 = clock()
                entries = p.entries
                t2 = clock()
                buffers, _ = p.buffers, p.keepalive
                t3 = clock()
                staging = np.empty(p.nbytes, dtype=np.uint8)
                bf.write_tail(p, memoryview(staging)[p.index_off:])
                t4 = clock()
                for e, mv in zip(entries, buffers):  # client_put's loop
                    if e.len >= threshold:
                        pass
                    elif e.len:
                        staging[e.off: e.off + e.len] = np.frombuffer(mv, dtype=np.uint8)
                t5 = clock()
                blob = memoryview(s)
                es = bf.read_index(blob)
                t6 = clock()
                vals = [bf.decode_entry(blob[e.off: e.off + e.len], e) for e in es]
                t7 = clock()
                [bf.materialize(x) for x in vals]
                t8 = clock()
                for name, dt in zip(pieces, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4,
                                             t6 - t5, t7 - t6, t8 - t7)):
                    pieces[name].append(dt)
        for name, ts in pieces.items():
            # the minimum of each sample's 15 timings, summed over samples
            best = sum(min(ts[i::n]) for i in range(n))
            print(f"    blobpipe {name:30} {best / n * 1e6:7.3f} µs/sample")
    finally:
        gc.enable()


def bench_large(args) -> None:
    n = args.tensor_mib * MIB // 4
    print(f"[2] write vs numpy copy: {args.tensors} x {args.tensor_mib} MiB float32, "
          f"best of {args.large_reps}")
    g = torch.Generator().manual_seed(1)
    tensors = [torch.rand(n, generator=g) + 1 for _ in range(args.tensors)]  # non-zero: resident
    p = bf.plan([f"w{i}" for i in range(args.tensors)], tensors)
    out = np.empty(p.nbytes, dtype=np.uint8)
    out.fill(1)  # pre-fault
    sources = [t.numpy().view(np.uint8) for t in tensors]
    spans = [out[e.off: e.off + e.len] for e in p.entries]

    def numpy_copy():
        for dst, src in zip(spans, sources):
            np.copyto(dst, src)

    best_copy = best_write = float("inf")
    for _ in range(args.large_reps):  # interleaved: both see the same machine
        best_copy = min(best_copy, best_time(numpy_copy, 0, 1))
        best_write = min(best_write, best_time(lambda: bf.write(p, out), 0, 1))
    gbs = lambda s: args.tensors * args.tensor_mib * MIB / s / 1e9  # noqa: E731
    ratio = best_copy / best_write
    print(f"    numpy copy      {gbs(best_copy):8.2f} GB/s  ({best_copy * 1e3:.1f} ms)")
    print(f"    write           {gbs(best_write):8.2f} GB/s  ({best_write * 1e3:.1f} ms)")
    print(f"    write/copy      {ratio:8.2f}x       target >= 0.80x: {verdict(ratio >= 0.8)}")


def main() -> int:
    ap = argparse.ArgumentParser(description="blobpipe's Python package against the reference codec, numpy and the C++ pipeline")
    ap.add_argument("--quick", action="store_true", help="small sizes: checks that it runs")
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--tensor-mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5,
                    help="best of how many interleaved runs in section 1b (default 5)")
    ap.add_argument("--only", choices=["codec", "stream", "percall"],
                    help="run only sections 1-2 (codec), 3 (stream), or the per-call timings "
                         "of the storage client, read_index and plan+write (percall)")
    args = ap.parse_args()
    args.budget, args.min_reps, args.large_reps = 3.0, 5, 5
    args.decode_entries, args.decode_reps = 10_000, args.reps
    args.client_samples, args.client_tokens = 64, 4096
    args.stream_reps = min(args.reps, 3)
    if args.quick:
        args.entries, args.tensor_mib, args.budget, args.min_reps, args.large_reps = 1000, 4, 0.2, 3, 2
        args.decode_entries, args.decode_reps = 1000, 2
        args.client_samples, args.client_tokens = 8, 256
        args.stream_reps = 1
    print(f"python_bench: blobpipe {bf.__version__} from {os.path.dirname(bf.__file__)}, "
          f"torch {torch.__version__}, numpy {np.__version__}, Python {sys.version.split()[0]}")
    if args.only == "percall":
        bench_per_call(args, load_reference()[0])
        return 0
    if args.only != "stream":
        ref, why = load_reference()
        bench_plan_write(args, ref, why)
        bench_decode(args, ref)
        bench_client(args, ref)
        bench_large(args)
    if args.only != "codec":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import python_stream
        python_stream.bench(args.quick, args.stream_reps, touch=False)
        python_stream.bench_shared_process(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
