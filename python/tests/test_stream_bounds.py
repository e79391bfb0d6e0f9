"""What a Consumer holds while Python is busy: events that hold no window
credit (aborted blobs with their reasons) are bounded too, and nothing is
lost once Python iterates again (docs/reliability.md "Bounded memory")."""

from __future__ import annotations

import time

import numpy as np
import pytest

import blobpipe as bf
from stream_cases import Pair, Thread

TRANSPORTS = ["inproc", "tcp"]

REASON = "r" * 4000
BLOBS = 12000  # about 48 MB of reasons, three times what the queue may hold


def settled(read, polls: int = 5, pause: float = 0.1, seconds: float = 60.0) -> int:
    """The value of ``read()`` once it stays the same for ``polls`` polls in
    a row, ``pause`` seconds apart; fails after ``seconds`` (a bound for a
    hung test, not a timing assertion)."""
    end = time.monotonic() + seconds
    last, same = read(), 0
    while same < polls:
        if time.monotonic() > end:
            raise AssertionError(f"still changing after {seconds} s: {last}")
        time.sleep(pause)
        now = read()
        same = same + 1 if now == last else 0
        last = now
    return last


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_flood_of_aborts_is_bounded_while_python_is_busy_and_nothing_is_lost(transport):
    one = np.zeros(1, dtype=np.uint8)
    with Pair(transport) as (sender, consumer):
        def flood():
            for i in range(BLOBS):
                blob = sender.open_blob(tag=b"a%d" % i)
                blob.emit("x", one)  # a blob with no entry is never sent
                blob.abort(REASON)
            sender.shutdown()
        t = Thread(flood)
        t.start()
        # Python takes nothing: the background thread reads until the queue
        # holds its bound beyond the window (16 MiB), then stops reading.
        read_ahead = settled(lambda: consumer.stats()["blobs_aborted"])
        assert 0 < read_ahead * len(REASON) <= 20 << 20, read_ahead
        events = list(consumer)
        t.join_result()
    aborted = [ev for ev in events if type(ev).__name__ == "BlobAborted"]
    assert len(aborted) == BLOBS
    assert len(events) == 2 * BLOBS  # and each blob's entry
    assert all(ev.reason == REASON for ev in aborted)
