"""Streaming from Python to Python: Sender -> Consumer over the in-process
transport and over TCP on 127.0.0.1 (round trips, abort, end of stream,
backpressure, close from another thread, asyncio, URLs, allow_pickle,
fork), and the type stubs against the module."""

from __future__ import annotations

import ast
import asyncio
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import blobpipe as bf
from stream_cases import Pair, Thread, pickled, same_value, sample_values, wait_until

TRANSPORTS = ["inproc", "tcp"]


def send_blobs(sender: bf.Sender, values: dict) -> None:
    """Blob b"one": every value, finished; blob b"two": one entry, aborted;
    then an orderly shutdown (the consumer's end of stream)."""
    with sender.open_blob(tag=b"one") as blob:
        for k, v in values.items():
            blob.emit(k, v)
    blob = sender.open_blob(tag=b"two")
    blob.emit("partial", torch.ones(3))
    blob.abort("rollout cancelled")
    sender.shutdown()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_values_round_trip_then_abort_then_end_of_stream(transport):
    values = sample_values()
    with Pair(transport) as (sender, consumer):
        t = Thread(lambda: send_blobs(sender, values))
        t.start()
        events = list(consumer)  # ends at the sender's shutdown
        t.join_result()

    tag1 = b"one".ljust(16, b"\0")
    tag2 = b"two".ljust(16, b"\0")
    n = len(values)
    kinds = [type(ev).__name__ for ev in events]
    assert kinds == ["EntryReady"] * n + ["BlobComplete", "EntryReady", "BlobAborted"], kinds
    for ev, (key, want) in zip(events[:n], values.items()):
        assert ev.tag == tag1 and ev.key == key and ev.entry.key == key
        tag, entry, value = ev
        assert same_value(value, want), (key, value, want)
        if isinstance(want, dict):
            assert entry.kind == bf.KIND_PICKLE
            assert bytes(ev.buffer) == pickled(want)
    complete = events[n]
    assert complete.tag == tag1 and len(complete.entries) == n
    assert [e.key for e in complete.entries] == list(values)
    assert events[n + 1].tag == tag2 and same_value(events[n + 1].value, torch.ones(3))
    aborted = events[n + 2]
    assert aborted.tag == tag2 and aborted.reason == "rollout cancelled"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_received_values_outlive_the_consumer(transport):
    with Pair(transport) as (sender, consumer):
        t = Thread(lambda: send_blobs(sender, {"x": torch.arange(10)}))
        t.start()
        first = next(iter(consumer))
        x = first.value
        del first
        rest = list(consumer)
        t.join_result()
    assert [type(ev).__name__ for ev in rest] == ["BlobComplete", "EntryReady", "BlobAborted"]
    assert torch.equal(x, torch.arange(10))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_backpressure_blocks_emit_and_loses_nothing(transport):
    entry = 16 << 10
    count = 64  # 1 MiB in all, 16 windows' worth
    with Pair(transport, consumer_options={"window_bytes": 64 << 10}) as (sender, consumer):
        assert sender.window_bytes == 64 << 10
        emitted = []

        def produce():
            with sender.open_blob(tag=b"bp") as blob:
                for i in range(count):
                    blob.emit(f"e{i}", np.full(entry, i % 251, dtype=np.uint8))
                    emitted.append(i)
            sender.shutdown()

        t = Thread(produce)
        t.start()
        # Nobody reads: the window and then the sender's queue fill, and
        # emit blocks.
        wait_until(lambda: sender._waiting == 1, "emit to block on the full window")
        assert len(emitted) < count
        assert t.is_alive()
        # Check each entry and drop it: a held entry keeps its window share.
        keys = []
        for ev in consumer:
            if isinstance(ev, bf.EntryReady):
                i = len(keys)
                keys.append(ev.key)
                assert ev.value.shape == (entry,) and bool((ev.value == i % 251).all()), i
        t.join_result()
        assert sender.stats()["queue_waits"] + sender.stats()["credit_waits"] > 0
    assert keys == [f"e{i}" for i in range(count)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_window_bytes_is_no_hard_limit_one_larger_entry_goes_alone(transport):
    # listen()'s docs: one entry larger than the window is admitted alone,
    # when nothing else is held, and its credit takes the window's place.
    window, big = 64 << 10, 256 << 10
    opts = {"window_bytes": window, "idle_timeout": 10}  # a refusal ends, not hangs
    with Pair(transport, consumer_options=opts) as (sender, consumer):
        def produce():
            with sender.open_blob(tag=b"big") as blob:
                blob.emit("a", np.full(16 << 10, 1, np.uint8))
                blob.emit("big", np.full(big, 2, np.uint8))
                blob.emit("c", np.full(16 << 10, 3, np.uint8))
            sender.shutdown()

        t = Thread(produce)
        t.start()
        got = []
        it = iter(consumer)
        while True:  # each event dropped before the next wait
            try:
                ev = next(it)
            except StopIteration:
                break
            if isinstance(ev, bf.EntryReady):
                got.append((ev.key, ev.value.nbytes, int(ev.value[0]), int(ev.value[-1])))
            del ev
        t.join_result()
        high = consumer.stats()["buffered_high_water"]
    assert got == [("a", 16 << 10, 1, 1), ("big", big, 2, 2), ("c", 16 << 10, 3, 3)], got
    # compact_entry_credit: len + key + its compact meta (12 + 8 per dim)
    # + 256 (docs/wire.md "Flow control"; |u1 travels in the compact form).
    assert high == big + len("big") + (12 + 8 * 1) + 256 > window, high


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_entries_queued_ahead_of_python_stay_in_the_window(transport):
    # The binding reads ahead of the Python iteration. Entries it queued but
    # Python has not taken are not "held by the application": they keep
    # their window credit, so a consumer nobody reads holds at most the
    # window, and the held allowance stays empty (docs/reliability.md
    # "Held entries": readers that queue ahead).
    entry, window = 16 << 10, 64 << 10
    with Pair(transport, consumer_options={"window_bytes": window}) as (sender, consumer):
        def produce():
            with sender.open_blob(tag=b"qa") as blob:
                for i in range(32):
                    blob.emit(f"e{i}", np.full(entry, i, dtype=np.uint8))
            sender.shutdown()

        t = Thread(produce)
        t.start()
        # Three entries fill the window (each costs its 16 KiB plus key,
        # meta and 256 bytes of credit; four do not fit 64 KiB). Wait until
        # the binding has queued three that are still in the window
        # (held_in_window_bytes counts entries yielded to the reader and not
        # moved out). A binding that moved queued entries into the allowance
        # gets there only after the allowance is full (three more entries in
        # it, six received), so the checks below see that state, not a
        # moment before the reader ran: waiting for emit() to block was such
        # a moment (the Python queue fills before the consumer has read
        # anything), and the mutant held.reader-queue-ahead passed.
        wait_until(lambda: consumer.stats()["held_in_window_bytes"] >= 3 * entry,
                   "the binding to queue a window's worth of entries ahead of Python")
        st = consumer.stats()
        assert st["held_bytes"] == 0, st
        assert st["held_high_water"] == 0, st
        assert st["entries_received"] * entry <= window, st
        assert sum(isinstance(ev, bf.EntryReady) for ev in consumer) == 32
        t.join_result()


def test_several_async_iterators_on_one_consumer_all_end():
    # Two tasks in one event loop and two more loops on other threads, all
    # iterating one Consumer: each waits on its own eventfd, so every one
    # ends at the end of the stream and no event is seen twice.
    with Pair("inproc") as (sender, consumer):
        counts = [0, 0, 0, 0]

        async def drain(k):
            async for _ in consumer:
                counts[k] += 1

        async def two_tasks():
            await asyncio.wait_for(asyncio.gather(drain(0), drain(1)), 60)

        loops = [Thread(lambda k=k: asyncio.run(asyncio.wait_for(drain(k), 60))) for k in (2, 3)]
        for t in loops:
            t.start()
        main_loop = Thread(lambda: asyncio.run(two_tasks()))
        main_loop.start()
        for i in range(300):
            sender.send_blob(["a"], [i])
        sender.shutdown()
        main_loop.join_result()
        for t in loops:
            t.join_result()
    assert sum(counts) == 600, counts  # 300 entries and 300 completions


def test_stats_after_the_end_keep_the_final_figures():
    # A stats() whose snapshot runs after the stream ended must not replace
    # the final figures with an empty consumer's zeros. The race is made
    # likely: another thread asks for stats all through the end, many times.
    for _ in range(40):
        with Pair("inproc") as (sender, consumer):
            done = threading.Event()

            def spam():
                while not done.is_set():
                    consumer.stats()

            spammer = Thread(spam)
            spammer.start()
            for i in range(5):
                sender.send_blob(["a"], [i])
            sender.shutdown()
            for _ in consumer:
                pass
            done.set()
            spammer.join_result()
            assert consumer.stats()["entries_received"] == 5


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_close_from_another_thread_wakes_a_blocked_iterator(transport):
    with Pair(transport) as (sender, consumer):
        it = Thread(lambda: list(consumer))
        it.start()
        wait_until(lambda: consumer._waiting == 1, "the iterator to block")
        consumer.close()
        assert it.join_result() == []  # woke and ended


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_close_from_another_thread_wakes_a_blocked_emit(transport):
    with Pair(transport, consumer_options={"window_bytes": 64 << 10}) as (sender, consumer):
        def produce():
            blob = sender.open_blob()
            for i in range(1000):
                blob.emit(str(i), np.zeros(16 << 10, dtype=np.uint8))

        t = Thread(produce)
        t.start()
        wait_until(lambda: sender._waiting == 1, "emit to block")
        sender.close()
        with pytest.raises(bf.ClosedError) as e:
            t.join_result()
        assert e.value.category == "closed"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_async_for_yields_the_same_events(transport):
    values = {"a": torch.arange(5), "n": np.arange(3.0), "m": {"k": 1}}
    with Pair(transport) as (sender, consumer):
        t = Thread(lambda: send_blobs(sender, values))
        t.start()

        async def drain():
            return [ev async for ev in consumer]

        events = asyncio.run(drain())
        t.join_result()
    assert [type(ev).__name__ for ev in events] == \
        ["EntryReady"] * 3 + ["BlobComplete", "EntryReady", "BlobAborted"]
    for ev, (k, v) in zip(events, values.items()):
        assert ev.key == k and same_value(ev.value, v)
    assert events[-1].reason == "rollout cancelled"


def test_async_for_lets_other_tasks_run_while_it_waits():
    sender, consumer = bf.loopback_pair()
    with sender, consumer:
        async def main():
            got = []

            async def consume():
                async for ev in consumer:
                    got.append(ev)

            task = asyncio.create_task(consume())
            await asyncio.sleep(0)  # the consumer awaits; this task still runs
            assert not got
            await asyncio.to_thread(send_blobs, sender, {"x": torch.zeros(2)})
            await asyncio.wait_for(task, 60)
            return got

        events = asyncio.run(main())
    assert [type(ev).__name__ for ev in events] == \
        ["EntryReady", "BlobComplete", "EntryReady", "BlobAborted"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_allow_pickle_false_yields_the_pickle_bytes(transport):
    meta = {"idx": 3, "text": "héllo"}
    with Pair(transport, consumer_options={"allow_pickle": False}) as (sender, consumer):
        t = Thread(lambda: send_blobs(sender, {"meta": meta, "t": torch.ones(2)}))
        t.start()
        events = list(consumer)
        t.join_result()
    assert events[0].value == pickled(meta) and isinstance(events[0].value, bytes)
    assert pickle.loads(events[0].value) == meta
    assert same_value(events[1].value, torch.ones(2))  # tensors unaffected


@pytest.mark.parametrize("url, part", [
    ("127.0.0.1:5555", "scheme"),
    ("http://127.0.0.1:5555", "scheme"),
    ("tcp://127.0.0.1", "port"),
    ("tcp://127.0.0.1:0", "port"),        # port 0 only to listen
    ("tcp://127.0.0.1:65536", "port"),
    ("tcp://:5555", "host"),
    ("tcp://::1:5555", "host"),           # IPv6 needs brackets
    ("ucx://[::1]:5555", "host"),         # UCX 1.13's tcp transport: IPv4 only
    ("tcp://127.0.0.1:5555/x", "port"),
])
def test_bad_url_raises_url_error(url, part):
    with pytest.raises(bf.URLError) as e:
        bf.connect(url)
    assert isinstance(e.value, ValueError)
    assert e.value.part == part and e.value.category == "invalid_argument"


def test_listen_refuses_a_bad_url_too():
    with pytest.raises(bf.URLError):
        bf.listen("udp://127.0.0.1:0")


def test_url_errors_are_the_cpp_parsers_own():
    # The message is blobpipe::parse_url's (lib/transport/url), for connect,
    # listen and parse_url alike.
    for call in (bf.connect, bf.listen, bf.parse_url):
        with pytest.raises(bf.URLError) as e:
            call("http://127.0.0.1:5555")
        assert str(e.value).endswith("URL 'http://127.0.0.1:5555': unknown scheme 'http' "
                                     "(expected tcp, ucx or inproc)"), str(e.value)
    assert bf.parse_url("tcp://[::1]:5555") == ("tcp", "::1", 5555)
    assert bf.parse_url("tcp://localhost:0", listening=True) == ("tcp", "localhost", 0)
    # Port 0 is a listener's placeholder: no connect can use it.
    with pytest.raises(bf.URLError, match="port 0") as e:
        bf.parse_url("tcp://localhost:0")
    assert e.value.part == "port"
    with pytest.raises(TypeError):
        bf.parse_url(b"tcp://127.0.0.1:5555")


def test_accept_on_a_closed_listener_raises_closed():
    l = bf.listen("tcp://127.0.0.1:0")
    l.close()
    with pytest.raises(bf.ClosedError, match="the Listener is closed"):
        l.accept(timeout=1)


def test_a_loopback_pair_refuses_a_resend_session():
    with pytest.raises(ValueError, match="resend sessions need connect"):
        bf.loopback_pair(sender_options={"resend": True})


def test_a_loopback_pair_names_an_options_argument_that_is_no_dict():
    for name, given in (("sender_options", 5), ("consumer_options", [("window_bytes", 1)])):
        with pytest.raises(TypeError, match=f"{name}: expected a dict .* not (int|list)"):
            bf.loopback_pair(**{name: given})


def test_a_tag_that_is_no_bytes_is_a_type_error_naming_the_tag():
    s, c = bf.loopback_pair()
    try:
        for tag in ("abc", 1.5):
            with pytest.raises(TypeError, match=r"tag: expected bytes .* not (str|float)"):
                s.open_blob(tag=tag)
    finally:
        s.close()
        c.close()


@pytest.mark.parametrize("call", ["connect", "listen"])
def test_a_host_that_does_not_resolve_is_a_url_error_saying_so(call):
    url = "tcp://nonexistent.invalid:5630" if call == "connect" else "tcp://nonexistent.invalid:0"
    with pytest.raises(bf.URLError) as e:
        getattr(bf, call)(url)
    assert e.value.part == "host" and e.value.category == "invalid_argument"
    assert "cannot resolve 'nonexistent.invalid'" in str(e.value), str(e.value)


def test_connect_with_nobody_listening_raises_peer_failed():
    with bf.listen("tcp://127.0.0.1:0") as l:
        port = l.port  # free now that it is closed
        assert l.url == f"tcp://127.0.0.1:{port}"
    with pytest.raises(bf.PeerFailedError) as e:
        bf.connect(f"tcp://127.0.0.1:{port}")
    assert e.value.category == "peer_failed" and isinstance(e.value, bf.StreamError)
    assert "is a consumer listening there?" in str(e.value), str(e.value)


def test_resend_connect_with_nobody_listening_names_its_attempts():
    """A resend session's connect gives up after max_attempts, and its
    error says so (the sender's failure_reason), with a hint."""
    with bf.listen("tcp://127.0.0.1:0") as l:
        port = l.port  # free now that it is closed
    with pytest.raises(bf.PeerFailedError) as e:
        bf.connect(f"tcp://127.0.0.1:{port}", resend=True, max_attempts=2,
                   retry_delay=0.001, max_retry_delay=0.001)
    text = str(e.value)
    assert "no handshake with the consumer on 2 connection attempts in a row" in text, text
    assert "(max_attempts 2)" in text and "is the consumer listening" in text, text


def test_listen_on_an_address_in_use_raises_listen_error_an_os_error():
    # No peer is involved: not a PeerFailedError (a ConnectionError).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(bf.ListenError) as e:
            bf.listen(f"tcp://127.0.0.1:{port}")
    assert isinstance(e.value, OSError) and isinstance(e.value, bf.StreamError)
    assert not isinstance(e.value, ConnectionError)
    assert e.value.category == "peer_failed"
    assert f"127.0.0.1:{port}" in str(e.value) and "in use" in str(e.value), str(e.value)


def test_inproc_urls_join_a_sender_and_a_consumer_in_this_process():
    with bf.listen("inproc://py-test-18") as listener:
        assert listener.url == "inproc://py-test-18"
        acc = Thread(lambda: listener.accept(timeout=60))
        acc.start()
        with bf.connect(listener.url) as sender:
            consumer = acc.join_result()
            with sender.open_blob(tag=b"i") as blob:
                blob.emit("x", torch.arange(3))
        events = list(consumer)
        consumer.close()
    assert [type(ev).__name__ for ev in events] == ["EntryReady", "BlobComplete"]
    assert torch.equal(events[0].value, torch.arange(3))


def test_unknown_option_is_refused():
    with pytest.raises(TypeError):
        bf.loopback_pair(sender_options={"no_such_option": 1})


@pytest.mark.parametrize("option", [{"unacked_bytes": 1 << 20}, {"max_attempts": 3},
                                    {"retry_delay": 0.1}, {"max_retry_delay": 2}])
def test_a_resend_limit_without_resend_is_refused_naming_it(option):
    # A plain sender would ignore it: the caller meant a resend session.
    name = next(iter(option))
    with pytest.raises(ValueError) as e:
        bf.connect("tcp://127.0.0.1:1", **option)
    assert name in str(e.value) and "resend=True" in str(e.value), str(e.value)


def test_queue_bytes_zero_is_refused_naming_it():
    # 0 would silently mean the default: the window, at most 64 MiB.
    with pytest.raises(ValueError) as e:
        bf.loopback_pair(sender_options={"queue_bytes": 0})
    assert "queue_bytes" in str(e.value) and "not 0" in str(e.value), str(e.value)
    sender, consumer = bf.loopback_pair(sender_options={"queue_bytes": 1})
    assert sender.queue_bytes == 1
    sender.close()
    consumer.close()


def test_queue_bytes_above_64_mib_is_refused_naming_it():
    # The queue holds copies of small entries: its bound is the Sender's
    # memory against a consumer that grants much and reads nothing.
    with pytest.raises(ValueError) as e:
        bf.loopback_pair(sender_options={"queue_bytes": (64 << 20) + 1})
    assert "queue_bytes" in str(e.value) and "at most 67108864" in str(e.value), str(e.value)
    sender, consumer = bf.loopback_pair(sender_options={"queue_bytes": 64 << 20})
    assert sender.queue_bytes == 64 << 20
    sender.close()
    consumer.close()


def test_objects_are_unusable_after_close():
    sender, consumer = bf.loopback_pair()
    consumer.close()
    assert list(consumer) == []  # closed here: ends, no error
    sender.close()
    with pytest.raises(bf.ClosedError):
        sender.open_blob()


def test_sender_gone_without_shutdown_raises_peer_closed():
    sender, consumer = bf.loopback_pair()
    with consumer:
        blob = sender.open_blob(tag=b"open")
        blob.emit("x", torch.ones(1))
        sender.flush()
        sender.close()
        events = []
        with pytest.raises(bf.PeerClosedError):
            for ev in consumer:
                events.append(ev)
    assert isinstance(events[-1], bf.BlobAborted) and events[-1].tag == b"open".ljust(16, b"\0")


def test_objects_made_before_fork_raise_forked_error_in_the_child():
    values = {"x": torch.arange(4)}
    sender, consumer = bf.loopback_pair()
    listener = bf.listen("tcp://127.0.0.1:0")
    with sender, consumer, listener:
        with sender.open_blob(tag=b"pre") as blob:
            blob.emit("x", values["x"])
        sender.flush()
        before = next(iter(consumer))  # received before the fork
        pid = os.fork()
        if pid == 0:  # the child: exit status says what happened
            code = 0
            try:
                sender.open_blob()
                code = 10
            except bf.ForkedError as e:
                code = 0 if isinstance(e, bf.ClosedError) else 11
            except BaseException:
                code = 12
            try:
                next(iter(consumer))
                code = code or 13
            except bf.ForkedError:
                pass
            except BaseException:
                code = code or 14
            if not torch.equal(before.value, values["x"]):  # still readable
                code = code or 15
            # close() is a no-op in the child (the thread is the parent's):
            # it returns at once, never waits for a thread that is not there.
            signal.alarm(10)  # a hang ends the child with SIGALRM
            for obj in (sender, consumer, listener):
                try:
                    obj.close()
                except BaseException:
                    code = code or 16
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's objects are unaffected.
        send_blobs(sender, {"y": torch.ones(1)})
        assert [type(ev).__name__ for ev in consumer] == \
            ["BlobComplete", "EntryReady", "BlobComplete", "EntryReady", "BlobAborted"]


def test_untagged_blobs_of_two_processes_get_different_tags():
    """open_blob() without a tag draws a random uuid4 seeded in each process
    (and each forked child): two processes never start the same sequence."""
    code = ("import blobpipe as bf\n"
            "s, c = bf.loopback_pair()\n"
            "with c, s:\n"
            "    with s.open_blob() as b:\n"
            "        print(b.tag.hex())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    tags = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        tags.append(bytes.fromhex(done.stdout.strip()))
    assert all(len(t) == 16 and t[6] >> 4 == 4 for t in tags), tags  # uuid4
    assert tags[0] != tags[1]


def test_stubs_declare_every_public_streaming_member():
    """_blobpipe.pyi names each public class and member the module has."""
    stub = Path(bf.__file__).with_name("_blobpipe.pyi")
    tree = ast.parse(stub.read_text())
    declared = {n.name: {m.name for m in n.body if isinstance(m, (ast.FunctionDef,
                                                                  ast.AsyncFunctionDef))}
                | {t.id for m in n.body if isinstance(m, ast.Assign) for t in m.targets}
                for n in tree.body if isinstance(n, ast.ClassDef)}
    for name in ["Sender", "Blob", "Consumer", "Listener", "EntryReady", "BlobComplete",
                 "BlobAborted", "ReceivedBuffer"]:
        cls = getattr(bf, name)
        public = {a for a in vars(cls) if not a.startswith("_")}
        assert name in declared, name
        assert public <= declared[name], (name, public - declared[name])


def test_ctrl_c_interrupts_a_blocked_iterator():
    """SIGINT while next(consumer) waits raises KeyboardInterrupt in it."""
    main = threading.get_ident()
    with Pair("inproc") as (sender, consumer):
        def interrupt():
            wait_until(lambda: consumer._waiting == 1, "the iterator to block")
            signal.pthread_kill(main, signal.SIGINT)

        t = Thread(interrupt)
        t.start()
        with pytest.raises(KeyboardInterrupt):
            next(iter(consumer))
        t.join_result()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ctrl_c_leaves_nested_with_blocks_at_once_and_the_blob_is_aborted(transport):
    """SIGINT while emit waits for window space inside the README's nested
    `with sender:` / `with blob:` blocks: KeyboardInterrupt leaves both
    without waiting exit_flush_grace (5 s) for each abort to be queued, and
    the consumer reports the blob aborted. The bound, 4 s from the signal,
    is under one grace: a hang guard, not a timing of the path."""
    main = threading.get_ident()
    sent = []
    with Pair(transport, consumer_options={"window_bytes": 1 << 20}) as (sender, consumer):
        def interrupt():
            wait_until(lambda: sender._waiting == 1, "emit to block on the full window")
            sent.append(time.monotonic())
            signal.pthread_kill(main, signal.SIGINT)

        t = Thread(interrupt)
        t.start()
        with pytest.raises(KeyboardInterrupt):
            with sender:
                with sender.open_blob(tag=b"cut") as blob:
                    for i in range(64):
                        blob.emit(f"k{i}", np.zeros(1 << 19, np.uint8))
        left = time.monotonic()
        t.join_result()
        assert left - sent[0] < 4.0, f"the with blocks took {left - sent[0]:.1f} s to leave"
        events = []
        with pytest.raises(bf.StreamError):  # closed, not shut down
            for ev in consumer:
                events.append(ev)
    aborted = [ev for ev in events if isinstance(ev, bf.BlobAborted)]
    assert [ev.tag for ev in aborted] == [b"cut".ljust(16, b"\0")], events
    assert not any(isinstance(ev, bf.BlobComplete) for ev in events)


def test_ctrl_c_ends_a_resend_connect_at_once():
    """SIGINT while connect(resend=True) retries a peer that closes every
    connection at once: KeyboardInterrupt, and the retries stop with it.
    Before, the attempt ran on until the background thread's stop grace
    (5 s) cut it off, about ten more connections at 0.5 s apart; now the
    io thread drops it when the wait is interrupted."""
    main = threading.get_ident()
    accepted = []
    stop = threading.Event()
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.05)

        def serve():
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except socket.timeout:
                    continue
                accepted.append(1)
                conn.close()

        server = Thread(serve)
        server.start()

        def interrupt():
            wait_until(lambda: len(accepted) >= 1, "the first connection")
            signal.pthread_kill(main, signal.SIGINT)

        t = Thread(interrupt)
        t.start()
        with pytest.raises(KeyboardInterrupt):
            bf.connect(f"tcp://127.0.0.1:{srv.getsockname()[1]}", resend=True,
                       max_attempts=1000, retry_delay=0.5, max_retry_delay=0.5)
        t.join_result()
        after = len(accepted)
        stop.set()
        server.join_result()
    assert after <= 3, f"{after} connections: the attempt went on after Ctrl-C"


def test_handshake_timeout_ends_a_connect_to_a_silent_peer():
    """A peer that accepts the TCP connection and never says hello."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with pytest.raises(bf.TimedOutError) as e:
            bf.connect(f"tcp://127.0.0.1:{port}", handshake_timeout=0.2)
        assert e.value.category == "timed_out"


def test_a_connect_to_a_listener_that_never_accepts_names_handshake_timeout_and_accept():
    """The fresh-user review (2026-12-04): the TimedOutError said only
    "handshake: timed out". A Listener answers the hello from accept()."""
    with bf.listen("tcp://127.0.0.1:0") as listener:
        with pytest.raises(bf.TimedOutError) as e:
            bf.connect(f"tcp://127.0.0.1:{listener.port}", handshake_timeout=0.3)
    assert "handshake_timeout (300 ms)" in str(e.value)
    assert "accept" in str(e.value)
    with bf.listen("tcp://127.0.0.1:0") as listener:   # the sender's stall_timeout passes first
        with pytest.raises(bf.TimedOutError) as e:
            bf.connect(f"tcp://127.0.0.1:{listener.port}", handshake_timeout=5, stall_timeout=0.3)
    assert "stall_timeout (300 ms)" in str(e.value)


def test_a_sender_stall_timeout_names_itself():
    """A consumer that reads nothing: the sender, waiting for credit past
    its stall_timeout, fails with a TimedOutError naming the limit and its
    milliseconds (the review saw "timed out (timed_out)")."""
    with bf.listen("tcp://127.0.0.1:0", window_bytes=64 << 10) as listener:
        got = {}

        def send():
            try:   # raised by a send, flush, or the with block's end
                with bf.connect(f"tcp://127.0.0.1:{listener.port}", stall_timeout=0.3) as s:
                    for i in range(64):
                        s.send_blob(["x"], [np.full(16 << 10, i, np.uint8)])
                    s.flush()
            except bf.TimedOutError as ex:
                got["error"] = str(ex)

        t = Thread(send)
        t.start()
        c = listener.accept(timeout=10)   # accepted, never iterated
        t.join_result()
        c.close()
    assert "stall_timeout" in got.get("error", ""), got
    assert "300 ms" in got["error"], got


def test_a_resend_session_refuses_tags_it_would_cut_or_that_are_empty():
    """The fresh-user review (2026-12-04): tags of 21 bytes sharing their
    first 16 were cut to one tag, and the consumer dropped the second and
    third blobs as resends, with no error on either side. A resend session
    now refuses such a tag, and an all-zero one, up front (ValueError
    saying why); a plain session keeps the reference's cut."""
    with bf.listen("tcp://127.0.0.1:0") as listener:
        got = []

        def send():
            with bf.connect(f"tcp://127.0.0.1:{listener.port}", resend=True) as s:
                for tag in (b"rollout-sample-000001", b"", 5, bytes(16)):
                    with pytest.raises(ValueError) as e:
                        s.send_blob(["x"], [np.zeros(4, np.uint8)], tag=tag)
                    got.append(str(e.value))
                with pytest.raises(ValueError):
                    s.open_blob(tag=b"rollout-sample-000002")
                for i in range(3):
                    s.send_blob(["x"], [np.full(4, i, np.uint8)], tag=b"sample-%d" % i)
                s.shutdown()

        t = Thread(send)
        t.start()
        c = listener.accept(timeout=10)
        tags = [ev.tag for ev in c if isinstance(ev, bf.BlobComplete)]
        t.join_result()
    assert "at most 16 bytes, this one is 21" in got[0]
    assert all("16 zero bytes" in g for g in got[1:]), got
    assert tags == [(b"sample-%d" % i).ljust(16, b"\0") for i in range(3)]
    s, c = bf.loopback_pair()            # a plain session: cut, as the reference
    with s:
        assert s.send_blob(["x"], [np.zeros(4, np.uint8)], tag=b"rollout-sample-000001") == \
            b"rollout-sample-0"


def test_handshake_timeout_bounds_the_tcp_connect_itself():
    """A listener whose backlog is full never completes the TCP connect (the
    kernel drops the SYN and retries for minutes): handshake_timeout ends
    it, naming the cause (review finding: 134.8 s before)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        fill = []
        try:
            for _ in range(3):  # more than the backlog holds: never accepted
                s = socket.socket()
                s.setblocking(False)
                try:
                    s.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
                fill.append(s)
            with pytest.raises(bf.TimedOutError) as e:
                bf.connect(f"tcp://127.0.0.1:{port}", handshake_timeout=0.5)
            assert "handshake_timeout" in str(e.value)
        finally:
            for s in fill:
                s.close()


def closed_by_peer(sock: socket.socket, seconds: float) -> bool:
    """True when the other end closes ``sock`` within ``seconds`` (it sends
    nothing): recv sees the end (or a reset)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_handshake_timeout_closes_a_silent_peer_and_accept_goes_on():
    # The silent connection is closed at handshake_timeout; it is its
    # peer's failure, not the Listener's, so accept() keeps waiting and
    # takes the sender that comes next.
    with bf.listen("tcp://127.0.0.1:0", handshake_timeout=0.2) as listener:
        acc = Thread(lambda: listener.accept(timeout=60))
        acc.start()
        with socket.create_connection(("127.0.0.1", listener.port)) as silent:
            assert closed_by_peer(silent, 30)
        with bf.connect(listener.url) as sender:
            consumer = acc.join_result()
            with sender.open_blob(tag=b"g") as blob:
                blob.emit("x", torch.arange(3))
        events = list(consumer)
        consumer.close()
    assert [type(ev).__name__ for ev in events] == ["EntryReady", "BlobComplete"]


def test_silent_peers_in_front_of_a_sender_do_not_hold_up_accept():
    # Handshakes run side by side, at most 64: the 65th silent socket
    # closes the oldest (which sees its end well before the 30 s
    # handshake_timeout could close it), and the sender is accepted. Run one
    # at a time, sockets that never say hello, connected first, would make
    # accept() wait handshake_timeout (30 s here) for each, and
    # accept(timeout=20) would time out with the good sender queued behind
    # them.
    with bf.listen("tcp://127.0.0.1:0", handshake_timeout=30) as listener:
        acc = Thread(lambda: listener.accept(timeout=20))
        acc.start()
        silent = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(65)]
        try:
            assert closed_by_peer(silent[0], 20)
            with bf.connect(listener.url, handshake_timeout=20) as sender:
                consumer = acc.join_result()
                with sender.open_blob(tag=b"g") as blob:
                    blob.emit("x", torch.arange(3))
            events = list(consumer)
            consumer.close()
        finally:
            for sock in silent:
                sock.close()
    assert [type(ev).__name__ for ev in events] == ["EntryReady", "BlobComplete"]


EXIT_SCENARIOS = {
    "accept": "l = bf.listen('tcp://127.0.0.1:0')\n"
              "threading.Thread(target=l.accept, daemon=True).start()\n",
    # A resend connect retrying a port nobody listens on (the attempt's
    # cancel timer and the runtime still running at exit).
    "connect": "import socket\n"
               "so = socket.socket(); so.bind(('127.0.0.1', 0)); port = so.getsockname()[1]\n"
               "threading.Thread(target=lambda: bf.connect(f'tcp://127.0.0.1:{port}', resend=True,"
               " max_attempts=1000), daemon=True).start()\n",
    "iteration": "s, c = bf.loopback_pair()\n"
                 "threading.Thread(target=lambda: list(c), daemon=True).start()\n",
    "blocked_emit": "s, c = bf.loopback_pair(consumer_options=dict(window_bytes=1 << 20))\n"
                    "b = s.open_blob()\n"
                    "def emit():\n"
                    "    for i in range(100):\n"
                    "        b.emit(f'k{i}', np.zeros(1 << 19, np.uint8))\n"
                    "threading.Thread(target=emit, daemon=True).start()\n",
    "blocked_finish": "s, c = bf.loopback_pair(consumer_options=dict(window_bytes=1 << 20))\n"
                      "def send():\n"
                      "    b = s.open_blob()\n"
                      "    for i in range(3):\n"
                      "        b.emit(f'k{i}', np.zeros(1 << 19, np.uint8))\n"
                      "    b.finish()\n"
                      "threading.Thread(target=send, daemon=True).start()\n",
    # Threads going in and out of blobpipe (copies and waits without the
    # GIL) while the main thread runs Python: most likely to be on their
    # way back to the GIL when the interpreter finalizes.
    "busy_emit_and_iteration": "s, c = bf.loopback_pair()\n"
                               "threading.Thread(target=lambda: [repr(e) for e in c],"
                               " daemon=True).start()\n"
                               "def send(n):\n"
                               "    while True:\n"
                               "        with s.open_blob() as b:\n"
                               "            for i in range(4): b.emit(f'x{i}', np.zeros(n, np.uint8))\n"
                               "for n in (10, 10, 1 << 20):\n"
                               "    threading.Thread(target=send, args=(n,), daemon=True).start()\n",
}

# How the main thread ends: falling off the end, sys.exit, Ctrl-C.
EXIT_WAYS = {
    "end": "print('exiting', flush=True)\n",
    "sys_exit": "print('exiting', flush=True)\nsys.exit(0)\n",
    "ctrl_c": "print('exiting', flush=True)\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(60)\n",
}


@pytest.mark.parametrize("how", sorted(EXIT_WAYS))
@pytest.mark.parametrize("waiting_in", sorted(EXIT_SCENARIOS))
def test_interpreter_exits_cleanly_with_a_daemon_thread_waiting_in_blobpipe(waiting_in, how):
    # A daemon thread in blobpipe when the interpreter finalizes used to
    # abort the process (5-6 runs in 10): a thread taking the GIL back then
    # is ended by pthread_exit, whose unwind through a noexcept destructor
    # calls std::terminate. runtime.hpp: gil_released, park_if_finalizing.
    # Three runs each here (the main thread busy in Python, so the GIL is
    # contended at exit); 50 each by hand for the report.
    import subprocess
    import sys
    code = ("import threading, time, os, sys, signal\nimport numpy as np\nimport blobpipe as bf\n" +
            EXIT_SCENARIOS[waiting_in] +
            "t0 = time.monotonic()\n"
            "while time.monotonic() - t0 < 0.3: sum(range(1000))\n" + EXIT_WAYS[how])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    for run in range(3):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)
        # An uncaught KeyboardInterrupt ends Python 3.11 by SIGINT, as Ctrl-C would.
        want = -signal.SIGINT if how == "ctrl_c" else 0
        assert done.returncode == want, (run, done.returncode, done.stderr[-2000:])
        assert "exiting" in done.stdout
        assert "terminate called" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_emit_refuses_a_key_over_max_key_bytes_at_once_and_the_blob_goes_on(transport):
    with Pair(transport, consumer_options={"max_key_bytes": 8}) as (sender, consumer):
        assert sender.max_key_bytes == 8
        blob = sender.open_blob(tag=b"k")
        blob.emit("12345678", 1)                       # 8 bytes: the limit itself
        with pytest.raises(bf.FormatError) as e:
            blob.emit("123456789", 2)                  # 9 bytes
        assert e.value.category == "invalid_argument"
        assert "max_key_bytes (8 bytes)" in str(e.value) and "9 bytes" in str(e.value)
        blob.emit("ok", 3)                             # no stale error: the blob is usable
        blob.finish()
        sender.shutdown()
        events = list(consumer)
    kinds = [type(ev).__name__ for ev in events]
    assert kinds == ["EntryReady", "EntryReady", "BlobComplete"], kinds
    assert [ev.key for ev in events[:2]] == ["12345678", "ok"]


def test_emit_refuses_a_raw_entry_whose_bytes_its_dtype_and_shape_do_not_fill():
    with Pair("inproc") as (sender, consumer):
        blob = sender.open_blob(tag=b"r")
        with pytest.raises(bf.FormatError, match="has 8 bytes; its dtype and shape need 12") as e:
            blob.emit("r", bf.RawEntry("n", "<f4", (3,), bytes(8)))
        assert e.value.category == "invalid_argument"
        blob.emit("r", bf.RawEntry("n", "<f4", (3,), bytes(12)))  # the blob goes on
        blob.finish()
        sender.shutdown()
        events = list(consumer)
    assert [type(ev).__name__ for ev in events] == ["EntryReady", "BlobComplete"]


def meta_bytes(off: int, shape: tuple) -> int:
    """Length of the meta (index row) of a uint8 tensor entry at ``off``."""
    n = 1
    for d in shape:
        n *= d
    return len(bf.Entry("m", off, n, "t", "uint8", shape).meta_msgpack())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_emit_refuses_meta_over_max_meta_bytes_at_once_naming_key_and_limit(transport):
    # A tensor of 50 dimensions has a meta of 74 bytes: past a 64-byte limit.
    assert meta_bytes(0, (1,) * 50) > 64
    with Pair(transport, consumer_options={"max_meta_bytes": 64}) as (sender, consumer):
        assert sender.max_meta_bytes == 64
        blob = sender.open_blob(tag=b"m")
        blob.emit("small", torch.ones(2, dtype=torch.uint8))
        with pytest.raises(bf.FormatError) as e:
            blob.emit("deep", torch.ones((1,) * 50, dtype=torch.uint8))
        assert e.value.category == "invalid_argument"
        assert "'deep'" in str(e.value) and "max_meta_bytes (64 bytes)" in str(e.value), str(e.value)
        blob.emit("after", 3)  # refused before anything was sent: the blob goes on
        blob.finish()
        sender.shutdown()
        events = list(consumer)
    assert [type(ev).__name__ for ev in events] == ["EntryReady", "EntryReady", "BlobComplete"]
    assert [ev.key for ev in events[:2]] == ["small", "after"]


def test_an_entry_whose_compact_form_fits_max_meta_bytes_is_sent_though_its_msgpack_meta_does_not():
    # Empty, with a dim past 2^32: its msgpack meta (a uint64 dim) is 30
    # bytes, its compact form 12 + 8 x 2 = 28. A consumer limit of 29 takes
    # the compact form, as the C++ sender sends it (docs/wire.md "Compact
    # entries").
    shape = (1 << 40, 0)
    limit = 29
    assert len(bf.Entry("w", 0, 0, "n", "|u1", shape).meta_msgpack()) > limit
    assert 12 + 8 * len(shape) <= limit
    with Pair("inproc", consumer_options={"max_meta_bytes": limit}) as (sender, consumer):
        blob = sender.open_blob(tag=b"wide")
        blob.emit("w", np.zeros(shape, np.uint8))
        blob.finish()
        sender.shutdown()
        events = list(consumer)
    assert [type(ev).__name__ for ev in events] == ["EntryReady", "BlobComplete"], events
    assert events[0].key == "w"


def test_meta_over_the_limit_only_at_its_blob_offset_fails_naming_key_and_limit():
    # Planned alone (offset 0) its meta fits; at its offset in the blob
    # (past 64 KiB, a uint32 instead of a fixint) it does not: the io
    # thread refuses it, the blob is aborted, and the next call says why.
    shape = (1,) * 12
    limit = meta_bytes(0, shape)
    assert meta_bytes(1 << 17, shape) > limit
    with Pair("inproc", consumer_options={"max_meta_bytes": limit}) as (sender, consumer):
        blob = sender.open_blob(tag=b"late")
        blob.emit("big", np.zeros(1 << 17, np.uint8))
        blob.emit("edge", torch.ones(shape, dtype=torch.uint8))
        with pytest.raises(bf.FormatError) as e:
            blob.finish()
        assert e.value.category == "invalid_argument"
        msg = str(e.value)
        assert "'edge'" in msg and f"max_meta_bytes ({limit} bytes)" in msg, msg
        sender.shutdown()
        events = list(consumer)
    assert type(events[-1]).__name__ == "BlobAborted", events


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_exception_in_a_sender_with_block_aborts_its_open_blob_naming_it(transport):
    with Pair(transport) as (sender, consumer):
        with pytest.raises(ValueError):
            with sender:
                blob = sender.open_blob(tag=b"open")
                blob.emit("x", torch.arange(3))
                done = sender.open_blob(tag=b"done")
                done.emit("y", 1)
                done.finish()
                raise ValueError("rollout failed")
        events = []
        with pytest.raises(bf.PeerClosedError):  # closed, not shut down
            for ev in consumer:
                events.append(ev)
    aborted = [ev for ev in events if isinstance(ev, bf.BlobAborted)]
    assert len(aborted) == 1 and aborted[0].tag == b"open".ljust(16, b"\0"), events
    assert "ValueError('rollout failed')" in aborted[0].reason, aborted[0].reason
    assert sum(isinstance(ev, bf.BlobComplete) for ev in events) == 1


def test_a_dropped_open_blob_is_aborted_with_a_reason_naming_the_python_blob():
    # Not the C++ writer's own reason ("blob_writer dropped"), an internal name.
    with Pair("inproc") as (sender, consumer):
        blob = sender.open_blob(tag=b"lost")
        blob.emit("x", 1)
        del blob  # CPython frees it here: its reference count reaches zero
        sender.shutdown()
        events = list(consumer)
    assert [type(ev).__name__ for ev in events] == ["EntryReady", "BlobAborted"], events
    reason = events[1].reason
    assert "Blob was dropped without finish() or abort()" in reason, reason
    assert "blob_writer" not in reason, reason


@pytest.mark.parametrize("copy", [True, False])
def test_emit_copy_false_sends_a_large_tensor_from_its_own_memory(copy):
    # The tensor waits for window space behind a filler that takes the
    # whole window. Copied (the default), the consumer gets its values at
    # emit; held (copy=False, zero-copy), the bytes the background thread
    # reads when it sends: a write made meanwhile shows (the caller's
    # promise covers reallocation, not writes).
    with Pair("inproc", consumer_options={"window_bytes": 1 << 20}) as (sender, consumer):
        t = torch.zeros(1 << 18)                           # 1 MiB, above inline_bytes
        blob = sender.open_blob(tag=b"z")
        blob.emit("filler", np.zeros(1 << 20, np.uint8))   # the whole window
        blob.emit("t", t, copy=copy)
        t.fill_(7)
        ender = Thread(lambda: (blob.finish(), sender.shutdown()))
        ender.start()
        got = []  # a copy of t's value; no event held (their bytes are the window)
        for ev in consumer:
            if isinstance(ev, bf.EntryReady) and ev.key == "t":
                got.append(ev.value.clone())
        ender.join_result()
    assert len(got) == 1
    assert torch.equal(got[0], torch.full((1 << 18,), 0.0 if copy else 7.0))


def test_blob_aborted_repr_shows_the_reason_as_python_writes_it():
    # A reason that quotes a key reads as written (no literal \' escapes);
    # a newline in it stays escaped, so a peer cannot forge a line.
    with Pair("inproc") as (sender, consumer):
        blob = sender.open_blob(tag=b"r")
        blob.emit("x", 1)
        blob.abort("entry 'k': refused\nOK: forged")
        sender.shutdown()
        events = list(consumer)
    text = repr(events[-1])
    assert "reason=\"entry 'k': refused\\nOK: forged\")" in text, text
    assert "\\'" not in text and "\n" not in text, text


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_exception_in_a_blob_with_block_aborts_it_naming_it(transport):
    with Pair(transport) as (sender, consumer):
        with pytest.raises(KeyError):
            with sender.open_blob(tag=b"b") as blob:
                blob.emit("x", 1)
                raise KeyError("k")
        sender.shutdown()
        events = list(consumer)
    assert [type(ev).__name__ for ev in events] == ["EntryReady", "BlobAborted"]
    assert "KeyError('k')" in events[1].reason, events[1].reason


@pytest.mark.parametrize("options", [
    {"sender_options": {"stall_timeout": "1"}},
    {"sender_options": {"chunk_bytes": "x"}},
    {"consumer_options": {"idle_timeout": b"1"}},
    {"sender_options": [1]},
])
def test_wrong_typed_options_raise_type_error(options):
    with pytest.raises(TypeError):
        bf.loopback_pair(**options)


@pytest.mark.parametrize("options, error, says", [
    # Counts and sizes: an int within the option's range, named with it.
    ({"sender_options": {"chunk_bytes": 63}}, ValueError, "chunk_bytes must be within 64..4294967295, not 63"),
    ({"sender_options": {"chunk_bytes": -1}}, ValueError, "chunk_bytes must be within 64..4294967295, not -1"),
    ({"consumer_options": {"window_bytes": 0}}, ValueError, "window_bytes must be within 1.."),
    ({"consumer_options": {"max_open_blobs": 1 << 32}}, ValueError, "not 4294967296"),
    ({"consumer_options": {"inline_bytes": (1 << 20) + 1}}, ValueError, "inline_bytes must be within 0..1048576"),
    ({"consumer_options": {"max_entry_bytes": 1 << 64}}, ValueError, "not 18446744073709551616"),
    ({"consumer_options": {"window_bytes": True}}, TypeError, "window_bytes must be an int"),
    # Seconds: finite and not negative.
    ({"consumer_options": {"idle_timeout": float("nan")}}, ValueError,
     "idle_timeout must be a finite number of seconds >= 0, not nan"),
    ({"sender_options": {"stall_timeout": -1}}, ValueError, "stall_timeout must be a finite number"),
    ({"sender_options": {"stall_timeout": float("inf")}}, ValueError, "not inf"),
    ({"sender_options": {"stall_timeout": True}}, TypeError, "stall_timeout must be a number of seconds"),
    # Flags: a bool, not a truthy value.
    ({"sender_options": {"resend": 1}}, TypeError, "resend must be True or False"),
    # Names: str, whatever dict the options come in.
    ({"sender_options": {1: 2}}, TypeError, "option names are str, not int"),
])
def test_an_option_out_of_its_range_raises_naming_it_and_the_range(options, error, says):
    with pytest.raises(error) as e:
        bf.loopback_pair(**options)
    assert says in str(e.value), str(e.value)


def test_a_count_may_be_any_integer_and_not_a_bool():
    # numpy's integers too (operator.index), as a size computed with numpy is.
    sender, consumer = bf.loopback_pair(consumer_options={"window_bytes": np.int64(1 << 20)},
                                        sender_options={"chunk_bytes": np.uint32(1 << 16)})
    sender.close()
    consumer.close()
    with pytest.raises(TypeError):
        bf.loopback_pair(consumer_options={"window_bytes": np.float64(1 << 20)})
    # numpy's bool is no count either, though operator.index takes it.
    for flag in (True, np.True_):
        with pytest.raises(TypeError, match="window_bytes must be an int"):
            bf.loopback_pair(consumer_options={"window_bytes": flag})


def test_codec_calls_with_the_wrong_arguments_raise_type_error_as_python_does():
    view = np.arange(3, dtype="<i4").tobytes()
    entry = bf.Entry("x", 0, 12, "n", "<i4", (3,))
    assert bf.decode_entry(view, e=entry).tolist() == [0, 1, 2]
    cases = [
        (lambda: bf.decode_entry(view, entry, entry), "decode_entry() takes 2 positional arguments but 3 were given"),
        (lambda: bf.decode_entry(view, entry, e=entry), "decode_entry() got multiple values for argument 'e'"),
        (lambda: bf.decode_entry(view, entry, nope=1), "decode_entry() got an unexpected keyword argument 'nope'"),
        (lambda: bf.decode_entry(view), "decode_entry() missing required argument 'e'"),
        (lambda: bf.read_index(), "read_index() missing required argument 'blob'"),
        (lambda: bf.decode_entries(view, [entry], allow=True), "unexpected keyword argument 'allow'"),
    ]
    for call, says in cases:
        with pytest.raises(TypeError) as e:
            call()
        assert says in str(e.value), str(e.value)


def test_wrong_typed_stream_arguments_raise_type_error():
    with Pair("inproc") as (sender, consumer):
        with pytest.raises(TypeError):
            sender.open_blob(tag=1.5)
        with pytest.raises(TypeError):
            sender.open_blob().abort(None)
    with pytest.raises(TypeError):
        bf.connect(None)
    with bf.listen("tcp://127.0.0.1:0") as listener:
        with pytest.raises(TypeError):
            listener.accept(timeout="1")


# ---- held entries (docs/reliability.md "Held entries") ----

def send_two_40_mib_blobs(sender: bf.Sender) -> None:
    a = torch.arange(10 << 20, dtype=torch.float32)  # 40 MiB
    b = torch.ones(10 << 20, dtype=torch.float32)
    for k in range(2):
        with sender.open_blob(tag=b"big%d" % k) as blob:
            blob.emit("a", a)
            blob.emit("b", b)
    sender.shutdown()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_readme_loop_holding_the_previous_event_completes_with_the_default_window(transport):
    # The README's loop keeps the previous event and its value alive while
    # it waits for the next one. Without the held allowance the sender
    # waits for credit the loop holds, forever; held_timeout here turns
    # that into TimedOutError instead of a hung test.
    with Pair(transport, consumer_options={"held_timeout": 5}) as (sender, consumer):
        t = Thread(lambda: send_two_40_mib_blobs(sender))
        t.start()
        entries = complete = 0
        for ev in consumer:
            match ev:
                case bf.EntryReady(tag, entry, value):
                    entries += 1
                    assert value.numel() == 10 << 20
                case bf.BlobComplete(tag):
                    complete += 1
        t.join_result()
        st = consumer.stats()
    assert (entries, complete) == (4, 2)
    assert 0 < st["held_high_water"] <= 64 << 20       # the allowance served, within its bound
    assert st["buffered_high_water"] <= 64 << 20      # and the window stayed the window


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_readme_loop_holding_the_previous_event_completes_with_entries_larger_than_the_window(transport):
    # The fresh-user review's case (2026-12-04): each entry larger than the
    # window and the held allowance (1 MiB each here, entries of 3 MiB).
    # The value the loop keeps moves alone into the empty allowance, so the
    # next entry is admitted; before, the loop stalled until held_timeout.
    opts = {"window_bytes": 1 << 20, "held_timeout": 3}
    with Pair(transport, consumer_options=opts) as (sender, consumer):
        def send():
            for k in range(3):
                sender.send_blob(["a"], [np.full(3 << 20, k, np.uint8)])
            sender.shutdown()
        t = Thread(send)
        t.start()
        entries = complete = 0
        for ev in consumer:
            match ev:
                case bf.EntryReady(tag, entry, value):
                    assert value.nbytes == 3 << 20 and value[0] == entries
                    entries += 1
                case bf.BlobComplete(tag):
                    complete += 1
        t.join_result()
        st = consumer.stats()
    assert (entries, complete) == (3, 3)
    assert 3 << 20 <= st["held_high_water"] < 6 << 20   # one larger value, alone


def emit_until_refused(sender: bf.Sender, n: int, nbytes: int) -> int:
    """Emits n entries of nbytes into one blob; returns how many were
    emitted before the consumer went away (emit raises then)."""
    blob = sender.open_blob()
    for i in range(n):
        try:
            blob.emit(f"e{i}", np.full(nbytes, i, np.uint8))
        except bf.StreamError:
            return i
    return n


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_holding_past_the_held_allowance_raises_timed_out_naming_window_and_held_bytes(transport):
    window = held = 256 << 10
    opts = {"window_bytes": window, "held_bytes": held, "held_timeout": 0.2}
    with Pair(transport, sender_options={"chunk_bytes": 64 << 10},
              consumer_options=opts) as (sender, consumer):
        t = Thread(lambda: emit_until_refused(sender, 12, 100 << 10))
        t.start()
        kept = []                                       # every value, never dropped
        most = {"buffered_bytes": 0, "held_bytes": 0}

        def iterate():
            for ev in consumer:
                kept.append(ev)
                st = consumer.stats()
                for k in most:
                    most[k] = max(most[k], st[k])

        it = Thread(iterate)   # a thread, so that a hang fails the test
        it.start()
        with pytest.raises(bf.TimedOutError) as err:
            it.join_result(60)
        emitted = t.join_result()
    most_buffered, most_held = most["buffered_bytes"], most["held_bytes"]
    msg = str(err.value)
    assert err.value.category == "timed_out"
    assert "held_bytes" in msg and "window" in msg and "held_timeout" in msg, msg
    assert 3 <= len(kept) <= emitted < 12
    assert most_buffered <= window and most_held <= held


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_several_threads_iterating_one_consumer_all_end_at_end_of_stream(transport):
    with Pair(transport) as (sender, consumer):
        def send():
            for k in range(50):
                with sender.open_blob() as blob:
                    blob.emit("x", np.full(16, k, np.int64))
            sender.shutdown()

        readers = [Thread(lambda: sum(1 for _ in consumer)) for _ in range(4)]
        for r in readers:
            r.start()
        t = Thread(send)
        t.start()
        t.join_result()
        counts = [r.join_result(60) for r in readers]   # each one ends
    assert sum(counts) == 100  # 50 EntryReady + 50 BlobComplete, each to one thread


# ---- a consumer that is not blobpipe's (raw socket, docs/wire.md) ----------

def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        part = conn.recv(n - len(out))
        if not part:
            raise ConnectionError("the sender closed")
        out += part
    return out


def _read_frame(conn: socket.socket) -> tuple[int, bytes]:
    """The next frame: its type and payload (docs/wire.md "Frame header")."""
    ftype, _flags, _reserved, length, _blob, _arg = struct.unpack("<BBHIQQ", _recv_exact(conn, 24))
    return ftype, _recv_exact(conn, length)


def _send_frame(conn: socket.socket, ftype: int, payload: bytes = b"") -> None:
    conn.sendall(struct.pack("<BBHIQQ", ftype, 0, 0, len(payload), 0, 0) + payload)


HELLO, ENTRY_BEGIN, CLOSE = 1, 3, 8


def _answer_hello(conn: socket.socket, window: int) -> None:
    """Reads the sender's hello and answers as a consumer granting
    ``window`` bytes, with a delivery log when the sender names a session
    (docs/wire.md "Handshake"); accepts no feature."""
    ftype, offer = _read_frame(conn)
    assert ftype == HELLO
    chunk, = struct.unpack_from("<I", offer, 8)
    session = offer[32:48]
    inline, = struct.unpack_from("<I", offer, 56)
    dedup_window = 4096 if session != bytes(16) else 0
    reply = struct.pack("<IHHIIQII16sQIHH", 0x50575042, 3, 2, chunk, 64 << 10, window, 4096,
                        dedup_window, session, 0, inline, 0, 0)
    _send_frame(conn, HELLO, reply)


def test_a_consumers_close_reason_is_in_the_senders_error():
    """A consumer that refuses the stream says why in its close frame; the
    Sender's PeerClosedError carries the reason (it said only "peer closed")."""
    reason = "entry 'x' of 4096 bytes is over max_entry_bytes (16)"
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()

        def send():
            with pytest.raises(bf.PeerClosedError) as e:
                with bf.connect(f"tcp://127.0.0.1:{srv.getsockname()[1]}") as s:
                    for _ in range(10_000):
                        s.send_blob(["x"], [np.zeros(1024, np.float32)])
                        s.flush()
            return str(e.value)

        t = Thread(send)
        t.start()
        conn, _ = srv.accept()
        with conn:
            _answer_hello(conn, 1 << 20)
            while _read_frame(conn)[0] != ENTRY_BEGIN:
                pass
            _send_frame(conn, CLOSE, reason.encode())
            text = t.join_result(60)
    assert "the consumer closed the stream: entry 'x' of 4096 bytes is over max_entry_bytes (16)" in text, text


def test_the_sender_bounds_its_queue_whatever_window_the_consumer_grants():
    """A consumer that grants a window of 2^64 - 1 and reads nothing (a
    Sender queued 6 GB in 10 s against one): the queue limit is the
    window but at most 64 MiB, the queued bytes stay within it while emit
    blocks, and the Sender's stall_timeout ends the wait (TimedOutError)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        got = {"peak": 0}

        def send():
            s = bf.connect(f"tcp://127.0.0.1:{srv.getsockname()[1]}", stall_timeout=0.5)
            got["limit"] = s.queue_bytes
            x = np.zeros(1 << 20, np.uint8)   # 1 MiB: held, sent from its memory
            try:
                for _ in range(1024):   # 1 GiB, were it all queued
                    s.send_blob(["x"], [x])
                    got["peak"] = max(got["peak"], s.stats()["queued_bytes"])
                s.flush()
            except bf.TimedOutError as e:
                got["error"] = str(e)
            got["stats"] = s.stats()
            s.close()

        t = Thread(send)
        t.start()
        conn, _ = srv.accept()
        with conn:
            _answer_hello(conn, 2**64 - 1)
            t.join_result(60)
    assert got["limit"] == 64 << 20
    assert "stall_timeout" in got.get("error", ""), got
    assert got["stats"]["queue_waits"] > 0   # emit blocked instead of queueing on
    assert 0 < got["peak"] <= got["limit"]


def test_a_resend_shutdown_returns_when_no_connection_delivers():
    """A consumer that completes the handshake and then closes, every time:
    shutdown() of a resend session with a blob to deliver reconnected for
    ever. It now raises once max_attempts connections in a row delivered
    nothing, naming max_attempts, having made that many connections."""
    accepted = []
    stop = threading.Event()
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.05)

        def serve():
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except socket.timeout:
                    continue
                with conn:
                    accepted.append(1)
                    try:
                        _answer_hello(conn, 1 << 20)
                    except (OSError, ConnectionError):
                        pass

        server = Thread(serve)
        server.start()
        try:
            s = bf.connect(f"tcp://127.0.0.1:{srv.getsockname()[1]}", resend=True,
                           max_attempts=3, retry_delay=0.01, max_retry_delay=0.05)
            s.send_blob(["x"], [np.zeros(16, np.uint8)])

            def shut():
                with pytest.raises(bf.StreamError) as e:
                    s.shutdown()
                return str(e.value)

            closer = Thread(shut)   # a thread, so that a hang fails the test
            closer.start()
            text = closer.join_result(60)
        finally:
            stop.set()
            server.join_result()
    assert "max_attempts 3" in text, text
    # The first connection may end before send_blob kept the blob: one
    # dropped while nothing is kept does not count (an idle worker's).
    assert 3 <= len(accepted) <= 4, accepted


def held_behind_a_full_window(sender):
    """A 1 MiB tensor emitted with copy=False behind a filler that takes the
    whole 1 MiB window, so the Sender holds it unsent; returns it and its
    reference count before it was held."""
    t = torch.zeros(1 << 18)                           # 1 MiB, above inline_bytes
    unheld = sys.getrefcount(t)
    blob = sender.open_blob(tag=b"h")
    blob.emit("filler", np.zeros(1 << 20, np.uint8))   # the whole window: t waits
    blob.emit("t", t, copy=False)
    assert sys.getrefcount(t) > unheld                 # held by the Sender
    return t, unheld


def test_close_releases_held_values_before_it_returns():
    # Held values (copy=False) the background thread lets go of when
    # close() fails their commands are released by close() itself, not
    # when the Sender is collected (Sender.close's docstring).
    with Pair("inproc", consumer_options={"window_bytes": 1 << 20}) as (sender, consumer):
        t, unheld = held_behind_a_full_window(sender)
        sender.close()
        assert sys.getrefcount(t) == unheld


def test_every_concurrent_close_returns_with_held_values_released():
    # close() called from two threads at once: the one that waits for the
    # other's close must not return before the held values are released
    # either (Sender.close's docstring). Repeated, as which thread closes
    # and which waits is up to the scheduler.
    for _ in range(20):
        with Pair("inproc", consumer_options={"window_bytes": 1 << 20}) as (sender, consumer):
            t, unheld = held_behind_a_full_window(sender)
            start = threading.Barrier(2)
            after = []

            def close() -> None:
                start.wait()
                sender.close()
                after.append(sys.getrefcount(t))

            closers = [threading.Thread(target=close) for _ in range(2)]
            for c in closers:
                c.start()
            for c in closers:
                c.join()
            assert after == [unheld, unheld]


def test_a_resend_session_refused_by_a_consumer_with_smaller_limits_names_the_kept_entry():
    # A consumer restarted with a max_key_bytes below a kept entry's key is
    # refused at its hello (docs/wire.md "Delivery"): the session ends after
    # max_attempts, its message naming the kept blob, the entry and the limit.
    first = bf.listen("tcp://127.0.0.1:0")
    port = first.port
    got = Thread(lambda: first.accept(timeout=20))
    got.start()
    s = bf.connect(f"tcp://127.0.0.1:{port}", resend=True, max_attempts=50,
                   retry_delay=0.01, max_retry_delay=0.05)
    consumer = got.join_result(30)
    stop = threading.Event()
    second = None
    try:
        blob = s.open_blob(tag=b"kept")
        blob.emit("k" * 40, np.zeros(16, np.uint8))      # kept: the blob stays open
        s.flush()
        consumer.close()
        first.close()
        second = bf.listen(f"tcp://127.0.0.1:{port}", max_key_bytes=16)

        def serve():
            while not stop.is_set():
                try:
                    second.accept(timeout=0.05).close()
                except bf.StreamError:
                    pass

        server = Thread(serve)
        server.start()

        def end() -> str:
            try:
                blob.finish()
                s.shutdown()
            except bf.ProtocolViolationError as e:   # a hello the session cannot go on with
                return str(e)
            return "no error"

        ended = Thread(end)
        ended.start()
        text = ended.join_result(60)
        assert "max_attempts" in text, text
        assert "kept blob" in text and "entry 0" in text, text
        assert "max_key_bytes (16 bytes)" in text, text
    finally:
        stop.set()
        s.close()
        if second is not None:
            server.join_result(10)
            second.close()
