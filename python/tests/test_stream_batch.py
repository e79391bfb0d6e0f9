"""The batch calls of the streaming API: Blob.emit_many (many entries in one
call) and Sender.send_blob (a whole blob in one call, its finish not waited
for), over the in-process transport and TCP on 127.0.0.1."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import blobpipe as bf
from stream_cases import Pair, Thread, same_value, sample_values

TRANSPORTS = ["inproc", "tcp"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_emit_many_sends_what_emit_one_by_one_sends(transport):
    values = sample_values()
    with Pair(transport) as (sender, consumer):
        def send():
            with sender.open_blob(tag=b"many") as blob:
                blob.emit_many(list(values), list(values.values()))
            sender.shutdown()
        t = Thread(send)
        t.start()
        events = list(consumer)
        t.join_result()
    kinds = [type(ev).__name__ for ev in events]
    assert kinds == ["EntryReady"] * len(values) + ["BlobComplete"], kinds
    for ev, (key, want) in zip(events, values.items()):
        assert ev.key == key and same_value(ev.value, want), key


def test_emit_many_refuses_sequences_of_different_lengths_and_emits_nothing():
    with Pair("inproc") as (sender, consumer):
        blob = sender.open_blob(tag=b"x")
        with pytest.raises(ValueError) as e:
            blob.emit_many(["a", "b"], [1])
        assert isinstance(e.value, bf.FormatError) and e.value.category == "invalid_argument"
        assert "differ in length" in str(e.value)
        blob.emit("only", 1)
        blob.finish()
        sender.shutdown()
        events = list(consumer)
    assert [type(ev).__name__ for ev in events] == ["EntryReady", "BlobComplete"]
    assert events[0].key == "only"


def test_an_emit_many_error_names_the_entry_index_and_key_keeping_its_type():
    with Pair("inproc", consumer_options={"max_key_bytes": 8}) as (sender, consumer):
        blob = sender.open_blob(tag=b"many")
        with pytest.raises(TypeError) as e:  # pickle's own error, "cannot pickle"
            blob.emit_many(["a", "b", "bad"], [1, 2, threading.Lock()])
        assert str(e.value).startswith("emit_many: entry 2 (key 'bad'): "), str(e.value)
        with pytest.raises(bf.FormatError) as f:
            blob.emit_many(["c", "123456789"], [4, 5])
        assert f.value.category == "invalid_argument"
        assert str(f.value).startswith("emit_many: entry 1 (key '123456789'): "), str(f.value)
        assert "max_key_bytes (8 bytes)" in str(f.value)
        blob.finish()  # entries before the bad ones stay emitted
        sender.shutdown()
        events = list(consumer)
    assert [ev.key for ev in events if isinstance(ev, bf.EntryReady)] == ["a", "b", "c"]


def test_an_emit_many_error_names_a_key_utf8_cannot_spell_by_its_repr():
    # A lone surrogate has no UTF-8 form: the key is named as repr() shows
    # it, in a note, as a UnicodeError's args are its fields.
    with Pair("inproc") as (sender, consumer):
        blob = sender.open_blob(tag=b"many")
        with pytest.raises(UnicodeEncodeError) as e:
            blob.emit_many(["ok", "\ud800"], [1, 2])
        assert e.value.encoding == "utf-8", e.value.args
        assert e.value.__notes__ == ["emit_many: entry 1 (key '\\ud800')"], e.value.__notes__
        blob.finish()
        sender.shutdown()
        events = list(consumer)
    assert [ev.key for ev in events if isinstance(ev, bf.EntryReady)] == ["ok"]


def test_an_emit_of_a_key_utf8_cannot_spell_raises_and_queues_nothing():
    # A key is sent as UTF-8 (Blob.emit): one with a lone surrogate raises
    # the UnicodeEncodeError, whatever the value (an array's encoding calls
    # nothing that would notice a pending error), and no entry goes out.
    with Pair("inproc") as (sender, consumer):
        blob = sender.open_blob(tag=b"one")
        blob.emit("ok", np.arange(4, dtype=np.uint8))
        for value in (np.arange(4, dtype=np.uint8), b"raw", 7):
            with pytest.raises(UnicodeEncodeError) as e:
                blob.emit("\ud800", value)
            assert e.value.encoding == "utf-8", e.value.args
        blob.finish()
        sender.shutdown()
        events = list(consumer)
    assert [ev.key for ev in events if isinstance(ev, bf.EntryReady)] == ["ok"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_send_blob_streams_each_sample_as_a_complete_blob(transport):
    samples = [{f"{i}@input_ids": torch.arange(i, i + 2048),
                f"{i}@reward": torch.tensor(float(i)),
                f"{i}@meta": {"idx": i}} for i in range(50)]
    with Pair(transport) as (sender, consumer):
        def send():
            tags = [sender.send_blob(list(s), list(s.values()), tag=b"s%d" % i)
                    for i, s in enumerate(samples)]
            sender.shutdown()
            return tags
        t = Thread(send)
        t.start()
        events = list(consumer)
        tags = t.join_result()
    assert tags == [(b"s%d" % i).ljust(16, b"\0") for i in range(50)]
    complete = [ev for ev in events if isinstance(ev, bf.BlobComplete)]
    assert [ev.tag for ev in complete] == tags
    got = {ev.key: ev.value for ev in events if isinstance(ev, bf.EntryReady)}
    want = {k: v for s in samples for k, v in s.items()}
    assert got.keys() == want.keys()
    assert all(same_value(got[k], want[k]) for k in want)


def test_send_blob_with_a_refused_key_raises_and_the_consumer_sees_the_blob_aborted():
    with Pair("inproc", consumer_options={"max_key_bytes": 8}) as (sender, consumer):
        with pytest.raises(bf.FormatError) as e:
            sender.send_blob(["ok", "123456789"], [1, 2], tag=b"bad")
        assert e.value.category == "invalid_argument" and "max_key_bytes" in str(e.value)
        sender.send_blob(["fine"], [3], tag=b"good")  # the Sender goes on
        sender.shutdown()
        events = list(consumer)
    kinds = [type(ev).__name__ for ev in events]
    assert kinds == ["EntryReady", "BlobAborted", "EntryReady", "BlobComplete"], kinds
    assert events[1].tag == b"bad".ljust(16, b"\0")
    assert events[1].reason.startswith("send_blob: ") and "max_key_bytes" in events[1].reason
    assert events[3].tag == b"good".ljust(16, b"\0")


def test_send_blob_refuses_sequences_of_different_lengths_before_opening_a_blob():
    with Pair("inproc") as (sender, consumer):
        with pytest.raises(ValueError, match="differ in length"):
            sender.send_blob(["a"], [1, 2])
        sender.shutdown()
        assert list(consumer) == []


@pytest.mark.parametrize("io_first", [False, True], ids=["any_timing", "io_thread_first"])
def test_a_send_blob_failure_met_later_is_raised_once_by_the_next_call(io_first):
    # The consumer's max_meta_bytes is the entry's msgpack meta planned
    # alone (offset 0). Its 12 dims do not fit the compact form (12 + 8 x
    # 12 bytes > the limit, docs/wire_features.md "Bit 4"), so the C++
    # sender sends it with msgpack meta, whose offset past 64 KiB is a
    # uint32, not a fixint: longer than the limit. emit's check (planned
    # alone) passes it; the io thread refuses it, and the blob is aborted.
    # That failure never raises inside send_blob, whenever the io thread
    # meets it: it is raised once, by the next call on the Sender.
    # io_first: queue_bytes=1 makes each entry's emit wait until the io
    # thread has run every command queued before it, so 'wide' has been
    # refused before send_blob queues 'after' and the finish.
    shape = (1,) * 12
    wide = torch.ones(shape, dtype=torch.uint8)
    limit = len(bf.Entry("wide", 0, 1, "t", "uint8", shape).meta_msgpack())
    assert len(bf.Entry("wide", 1 << 17, 1, "t", "uint8", shape).meta_msgpack()) > limit
    assert 12 + 8 * len(shape) > limit  # the compact form does not fit either
    sender_options = {"queue_bytes": 1} if io_first else None
    with Pair("inproc", sender_options=sender_options,
              consumer_options={"max_meta_bytes": limit}) as (sender, consumer):
        sender.send_blob(["ok", "wide", "after"], [np.zeros(1 << 17, np.uint8), wide, 2],
                         tag=b"late")
        with pytest.raises(bf.FormatError) as e:
            sender.flush()
        assert e.value.category == "invalid_argument"
        assert "send_blob (tag 6c617465" in str(e.value) and "'wide'" in str(e.value)
        assert f"max_meta_bytes ({limit} bytes)" in str(e.value), str(e.value)
        sender.send_blob(["next"], [1], tag=b"next")  # raised once: the Sender goes on
        sender.shutdown()
        events = list(consumer)
    kinds = [type(ev).__name__ for ev in events]
    assert kinds == ["EntryReady", "BlobAborted", "EntryReady", "BlobComplete"], kinds
    assert events[1].tag == b"late".ljust(16, b"\0") and events[3].tag == b"next".ljust(16, b"\0")


# ---- the queue and the copies' memory (Sender.stats, connect's queue_bytes) ----

ENTRY = 16 << 10   # copied by emit (at most inline_bytes): the 16 KiB size class
CLASS_KEPT = 1 << 20   # the most a size class keeps (Sender.stats docstring)


def test_copies_reuse_kept_memory_and_each_size_class_keeps_at_most_1_mib():
    # The consumer's window (256 KiB) stops the background thread while 256
    # copies (4 MiB) queue up; once they are sent, their memory comes back,
    # and the class keeps 1 MiB of it for the next blob's copies.
    x = np.full(ENTRY, 7, np.uint8)
    kept, stats = [], {}
    with Pair("inproc", sender_options={"queue_bytes": 8 << 20},
              consumer_options={"window_bytes": 256 << 10}) as (sender, consumer):
        def send():
            for tag in (b"first", b"second"):
                with sender.open_blob(tag=tag) as blob:
                    for i in range(256):
                        blob.emit(f"e{i}", x)
                sender.flush()
                after_flush = sender.stats()
                # flush() returns once all queued before it was handed over.
                assert after_flush["queued_bytes"] == 0, after_flush
                kept.append(after_flush["copy_bytes_kept"])
            stats.update(sender.stats())
            sender.shutdown()
        t = Thread(send)
        t.start()
        entries = sum(isinstance(ev, bf.EntryReady) and bool((ev.value == 7).all())
                      for ev in consumer)
        t.join_result()
    assert entries == 512
    assert all(0 < k <= CLASS_KEPT for k in kept), kept
    # The second blob's copies reused the 64 blocks (1 MiB) the first left.
    assert stats["copies_reused"] >= CLASS_KEPT // ENTRY, stats


def test_an_emit_blocked_on_a_full_queue_goes_on_once_half_of_it_is_free():
    # The queue holds 1 MiB (about 62 entries of 16 KiB); a slow consumer
    # keeps it full. An emit that blocked goes on when the queue is down to
    # half, so the next ~31 emits queue without blocking: at most one wait
    # per 31 entries, however the two threads interleave.
    x = np.full(ENTRY, 3, np.uint8)
    count, stats = 2000, {}
    with Pair("tcp", sender_options={"queue_bytes": 1 << 20}) as (sender, consumer):
        def send():
            with sender.open_blob(tag=b"q") as blob:
                for i in range(count):
                    blob.emit(f"e{i}", x)
            stats.update(sender.stats())
            sender.shutdown()
        t = Thread(send)
        t.start()
        n = 0
        for ev in consumer:
            if isinstance(ev, bf.EntryReady):
                n += 1
                if n % 16 == 0:
                    time.sleep(0.001)   # slower than the sender: the queue stays full
        t.join_result()
    assert n == count
    per_resume = ((1 << 20) // 2) // (ENTRY + 64 + 5)   # entries between two waits
    assert 0 < stats["queue_waits"] <= count // per_resume + 1, stats


@pytest.mark.parametrize("call", ["emit", "finish"])
def test_a_call_on_the_blob_from_inside_emit_many_comes_after_the_entries_before_it(call):
    # emit_many queues its entries in groups of about 1 MiB; a call on the
    # same blob made while it encodes entry 500 (here from a value's
    # __reduce__) still comes after entries 0-499, of which the last ~250
    # were not queued yet.
    small = np.full(8, 1, np.uint8)
    with Pair("inproc") as (sender, consumer):
        blob = sender.open_blob(tag=b"nested")

        class CallsTheBlob:
            def __reduce__(self):
                if call == "emit":
                    blob.emit("inner", small)
                else:
                    blob.finish()
                return (int, (0,))

        keys = [f"k{i}" for i in range(501)] + ["k501"]
        values = [np.full(4096, i % 251, np.uint8) for i in range(500)] + [CallsTheBlob(), small]

        def send():
            if call == "emit":
                blob.emit_many(keys, values)
                blob.finish()
            else:
                with pytest.raises(bf.ClosedError):
                    blob.emit_many(keys, values)
            sender.shutdown()
        t = Thread(send)
        t.start()
        events = list(consumer)
        t.join_result()
    got = [ev.key for ev in events if isinstance(ev, bf.EntryReady)]
    first = [f"k{i}" for i in range(500)]
    if call == "emit":
        assert got == first + ["inner", "k500", "k501"]
    else:
        assert got == first
    complete = [ev for ev in events if isinstance(ev, bf.BlobComplete)]
    assert len(complete) == 1 and len(complete[0].entries) == len(got)


def test_stats_after_close_are_the_last_figures():
    # close() returns once the background thread has dropped the C++
    # sender and kept its last figures; stats() then reads those.
    small = np.full(64, 5, np.uint8)
    for _ in range(20):
        sender, consumer = bf.loopback_pair()
        try:
            with sender.open_blob() as blob:
                for i in range(10):
                    blob.emit(f"e{i}", small)
            sender.close()
            assert sender.stats()["entries_sent"] == 10
        finally:
            sender.close()
            consumer.close()
