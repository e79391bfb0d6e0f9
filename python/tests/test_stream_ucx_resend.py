"""Streaming from Python over ucx:// (and tcp:// beside it), and resend
sessions from Python: a consumer that goes away mid-stream, a sender that
reconnects and resends, every blob reaching the application.

The ucx cases skip, with the repository's SKIPPED line, when UCX offers no
tcp transport on this machine (``ucx_info -d`` lists none), as the C++ UCX
tests skip (test/ucx_links.hpp): blobpipe's UCX endpoints then have no
transport to use.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

import pytest
import torch

import blobpipe as bf
from stream_cases import Thread, same_value, sample_values


def ucx_transports() -> tuple[set[str], str]:
    """The transports UCX lists here (``ucx_info -d``), or why none could be
    asked."""
    if shutil.which("ucx_info") is None:
        return set(), "ucx_info (Debian's ucx-utils) is not installed"
    out = subprocess.run(["ucx_info", "-d"], capture_output=True, text=True, timeout=60).stdout
    return {line.split(":", 1)[1].strip() for line in out.splitlines()
            if line.lstrip("# \t").startswith("Transport:")}, ""


def skip_unless_offered(scheme: str) -> None:
    if scheme != "ucx":
        return
    here, why = ucx_transports()
    if "tcp" not in here:
        pytest.skip(why or "ucx/tcp: UCX offers no tcp transport on this machine (it lists: "
                    + (",".join(sorted(here)) or "none") + ")")


SCHEMES = ["tcp", "ucx"]


def accept_and_connect(listener: bf.Listener, **sender_options):
    acc = Thread(lambda: listener.accept(timeout=60))
    acc.start()
    sender = bf.connect(listener.url, **sender_options)
    return sender, acc.join_result()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_values_round_trip_over_the_url_scheme(scheme):
    skip_unless_offered(scheme)
    values = sample_values()
    with bf.listen(f"{scheme}://127.0.0.1:0") as listener:
        assert listener.url.startswith(f"{scheme}://127.0.0.1:") and listener.port > 0
        sender, consumer = accept_and_connect(listener)
        with consumer:
            def send():
                with sender:
                    with sender.open_blob(tag=b"u") as blob:
                        for k, v in values.items():
                            blob.emit(k, v)
            t = Thread(send)
            t.start()
            events = list(consumer)
            t.join_result()
    assert [type(ev).__name__ for ev in events] == ["EntryReady"] * len(values) + ["BlobComplete"]
    for ev, (key, want) in zip(events, values.items()):
        assert ev.key == key and same_value(ev.value, want), key


@pytest.mark.parametrize("scheme", SCHEMES)
def test_resend_session_delivers_every_blob(scheme):
    skip_unless_offered(scheme)
    with bf.listen(f"{scheme}://127.0.0.1:0") as listener:
        sender, consumer = accept_and_connect(listener, resend=True)
        with consumer:
            def send():
                with sender:
                    for i in range(5):
                        with sender.open_blob(tag=b"r%d" % i) as blob:
                            blob.emit("i", torch.tensor(i))
                return sender.stats()
            t = Thread(send)
            t.start()
            tags = [ev.tag for ev in consumer if isinstance(ev, bf.BlobComplete)]
            stats = t.join_result()
    assert tags == [(b"r%d" % i).ljust(16, b"\0") for i in range(5)]
    assert stats["blobs_delivered"] == 5 and stats["reconnects"] == 0, stats


@pytest.mark.parametrize("scheme", SCHEMES)
def test_resend_session_reconnects_after_the_consumer_goes_and_resends(scheme):
    skip_unless_offered(scheme)
    first_gone = threading.Event()
    n = 6
    with bf.listen(f"{scheme}://127.0.0.1:0") as listener:
        sender, first = accept_and_connect(listener, resend=True, retry_delay=0.01)

        def send():
            with sender:
                for i in range(n):
                    with sender.open_blob(tag=b"r%d" % i) as blob:
                        blob.emit("i", torch.tensor(i))
                    if i == 0:
                        first_gone.wait(60)  # the rest go after the first consumer closed
            return sender.stats()

        t = Thread(send)
        t.start()
        for ev in first:
            if isinstance(ev, bf.BlobComplete):
                break
        first.close()  # mid-stream: the sender sees its connection end
        first_gone.set()
        with listener.accept(timeout=60) as second:  # the sender's reconnection
            events = list(second)
        stats = t.join_result()
    got = [ev.tag for ev in events if isinstance(ev, bf.BlobComplete)]
    want = [(b"r%d" % i).ljust(16, b"\0") for i in range(n)]
    # Blob 0 may come again (its acknowledgement may not have reached the
    # sender); every later one comes, in order, to the second consumer.
    assert [tg for tg in got if tg != want[0]] == want[1:], got
    assert stats["reconnects"] >= 1 and stats["blobs_delivered"] == n, stats
