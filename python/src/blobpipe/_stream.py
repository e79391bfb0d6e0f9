"""Streaming from Python: connect, listen, loopback_pair, and asyncio iteration.

The classes (Sender, Blob, Consumer, Listener, EntryReady, BlobComplete,
BlobAborted, ReceivedBuffer) are the extension module's; this module gives
the factories their public names. URLs are parsed, checked and connected
to by the C++ library (blobpipe/transport/url.hpp), as in C++.

Threads: every Sender, Consumer (of loopback_pair) and Listener runs
blobpipe's C++ pipeline on a background thread of its own; the Consumers a
Listener accepts share its thread. The thread never runs Python code and
never takes the GIL; Python calls hand it work through queues and wait, when
they must, with the GIL released. A thread ends when its objects are closed
(or garbage-collected): close(), shutdown(), the end of a ``with`` block.

Fork: a child process has none of its parent's threads. Objects made before
``os.fork()`` are unusable in the child: every call raises ForkedError (a
ClosedError), and what they own is never freed there (freeing could wait
forever for a lock the parent's thread held). Values received before the
fork stay readable in the child. Make Senders and Consumers after forking
(``multiprocessing`` with the "spawn" or "forkserver" start method avoids
the question).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Optional, Tuple

from . import _blobpipe

__all__ = ["connect", "listen", "loopback_pair", "parse_url"]

def _url(url: Any) -> str:
    if not isinstance(url, str):
        raise TypeError(f"the URL must be a str, not {type(url).__name__}")
    return url


def parse_url(url: str, *, listening: bool = False) -> Tuple[str, str, int]:
    """``(scheme, host, port)`` of ``scheme://host:port``, parsed by the C++
    library (``blobpipe/transport/url.hpp``: ``parse_url``), so Python and
    C++ take the same URLs and say the same about a bad one.

    The scheme is ``tcp``, ``ucx`` or ``inproc`` (``inproc://NAME``: a
    listener in this process; host is the name, port 0); the host a name,
    an IPv4 address or an IPv6 one in brackets (``tcp://[::1]:5555``; not
    for ``ucx``, whose tcp transport is IPv4 only in UCX 1.13); the port
    1..65535, or 0 when ``listening`` (a free port, which the Listener
    reports). Nothing is resolved here.

    Raises:
        URLError (a ValueError) with the C++ library's message; ``.part``
        (``"scheme"``, ``"host"`` or ``"port"``) names the part it blames.
        TypeError: ``url`` is not a str.
    """
    return _blobpipe._parse_url(_url(url), listening)


def connect(url: str, **options: Any) -> "_blobpipe.Sender":
    """Connects to a consumer at ``url`` and returns a started Sender.

    Args:
        url: ``tcp://host:port``, ``ucx://host:port`` (UCX picks its
            transports from ``UCX_TLS``; docs/ucx.md) or ``inproc://NAME``
            (a Listener of this process).
        options (keywords): sizes and counts are integers (numpy's
            too, not bools), seconds are int or float (not bools), flags
            are True or False.
            chunk_bytes: largest data frame proposed, bytes (default 1 MiB;
                the consumer may lower it).
            inline_bytes: copy threshold proposed, bytes (default 64 KiB, at
                most 1 MiB): ``emit`` copies entries up to it and holds
                larger ones.
            max_queued_bytes: copied bytes the C++ sender queues for its
                writer before it waits, bytes (default 4 MiB).
            queue_bytes: bytes emitted and not yet taken by the C++ sender
                beyond which ``emit`` blocks (until they are down to half of
                it), 1 to 64 MiB (default: the
                consumer's window, at most 64 MiB: a consumer may grant any
                window, and the Sender's memory keeps its own bound).
            stall_timeout: seconds the sender waits on a consumer that
                sends nothing and reads nothing (default and None or 0: no
                limit: a trainer busy with a step while its window is full
                is backpressure, not a fault), then TimedOutError (a resend
                session reconnects instead).
            handshake_timeout: seconds the handshake may take once
                connected (default 10; None or 0: no limit), then
                TimedOutError (a resend session tries again).
            resend: True for a resend session: every blob is kept until the
                consumer acknowledges it, and a broken connection is made
                again and the unacknowledged blobs resent (each reaches the
                application once). Costs a copy of every byte. The
                consumer knows a blob by its 16-byte tag: blobs whose tags
                are equal are one blob to it, and it drops the second as a
                resend. Give each blob its own tag, or None (a random
                uuid4); a tag longer than 16 bytes (two could be cut to
                one) or of 16 zero bytes is refused with ValueError.
            unacked_bytes, max_attempts, retry_delay, max_retry_delay:
                resend session limits (bytes, count, seconds, seconds;
                defaults 256 MiB, 8, 0.01, 1). The wait before a retry is
                ``retry_delay``, doubling, never above ``max_retry_delay``
                (a larger ``retry_delay`` waits that). ``max_attempts`` counts
                connection attempts in a row that deliver nothing: failed
                connects, and connections that end with no blob delivered
                while one was kept (a consumer that closes after the
                handshake, goes silent past ``stall_timeout``, or refuses
                a blob each time); then every call raises, the message
                naming max_attempts and the last cause. A connection
                dropped while nothing is kept (an idle worker whose
                consumer closes idle connections) does not count. Given
                without ``resend=True`` they raise ValueError.

    First checks, once, what no retry can fix (C++ ``check_connect_url``):
    the URL, and that its host resolves. Then waits for the connection and
    the handshake (Ctrl-C interrupts).

    Raises:
        URLError: a URL that cannot be used (see ``parse_url``), or a host
            that does not resolve ("cannot resolve 'HOST'", ``.part``
            ``"host"``).
        TypeError, ValueError: an unknown option or one whose name is not
            a str, a value of the wrong type or out of range (``queue_bytes``
            0 or above 64 MiB included), or a resend session limit without
            ``resend=True`` (the message names the option).
        PeerFailedError: nobody accepted the connection ("is a consumer
            listening there?").
        ProtocolViolationError: the peer is not a blobpipe consumer.
        PeerClosedError: the peer closed during the handshake.
    """
    return _blobpipe._connect(_url(url), options)


def listen(url: str, **options: Any) -> "_blobpipe.Listener":
    """Listens at ``url`` (port 0: a free port, see ``Listener.port``).

    Args:
        url: ``tcp://address:port`` (``0.0.0.0`` for every interface),
            ``ucx://address:port`` (IPv4 only) or ``inproc://NAME``; a host
            name listens on its address (``Listener.url`` says which).
        options (keywords), for every Consumer it accepts:
            window_bytes: the credit of the bytes the consumer holds
                (entries not yet freed, plus a tail being checked), bytes
                (default 64 MiB). Not a hard limit: one entry (or tail)
                larger than the window is admitted alone, when nothing else
                is held (so no window size deadlocks); ``max_entry_bytes``
                bounds that one.
            allow_pickle: False gives kind ``p`` entries as bytes instead of
                unpickling them (unpickling runs code chosen by the sender:
                pass False for peers you do not trust).
            stall_timeout, idle_timeout: seconds without progress from
                the sender while it owes bytes (a blob is open and it holds
                credit to send on; progress is an entry or blob completed,
                or 1 MiB of entry bytes: so also less than 1 MiB per
                stall_timeout), or without a byte at all, after which the
                stream ends with TimedOutError naming the option, and the
                sender is told why (None or 0: none).
                Both default to none: a worker may keep a blob open between
                entries while it generates, and be quiet between steps,
                which no default tells from a hung one. Set stall_timeout
                when your producers emit a blob's entries back to back (a
                peer that is gone is reported without it).
            held_bytes: the held allowance, bytes (default: window_bytes;
                0: none):
                values the iteration has given you and you still hold leave
                the window for it, oldest first, while they fit (with the
                default, one larger value alone when the allowance is
                empty; a value you give is a cap), so the sender
                goes on (a loop that keeps the previous event never starves
                it, whatever an entry's size). Memory: the larger of
                window_bytes and one entry's credit, + the larger of
                held_bytes and one entry's credit, of entry credit per
                Consumer (docs/reliability.md "Held entries"), and up to
                16 MiB of queued events that hold no credit (aborted
                blobs' reasons, completed blobs' indexes) while you do not
                iterate: past that the consumer reads no more until you do.
            held_timeout: seconds the iteration may wait while you hold more
                than held_bytes and part of the window too, nothing arriving
                (default 30; None or 0: no limit); then TimedOutError, whose
                message names the window, the bytes held and held_bytes.
            handshake_timeout: seconds an accepted connection's handshake
                may take (default 10; None or 0: no limit); past it the
                connection is closed and accept() goes on waiting (the
                handshakes run side by side: one silent peer never holds
                up the sender behind it).
            max_chunk_bytes, inline_bytes, max_key_bytes, max_meta_bytes,
            max_entry_bytes, max_tail_bytes, max_blob_bytes (bytes),
            max_open_blobs, max_entries_per_blob, payload_window (counts),
            recycle_bytes (bytes): as ``consumer_options`` in
            ``blobpipe/pipeline/consumer.hpp``.

    Raises:
        URLError, TypeError, ValueError: as ``connect`` (URLError also for
            an address the transport refuses, e.g. IPv6 over ucx).
        ListenError: the address cannot be bound (in use, not local); an
            ``OSError`` and a ``StreamError``.
    """
    return _blobpipe._listen(_url(url), options)


def loopback_pair(*, sender_options: Optional[dict] = None,
                  consumer_options: Optional[dict] = None
                  ) -> Tuple["_blobpipe.Sender", "_blobpipe.Consumer"]:
    """A Sender and a Consumer joined in this process by blobpipe's in-process
    transport (no socket: bytes are copied once, from the sender's buffers
    into the consumer's), each with its own background thread. For tests.

    Args:
        sender_options: keywords as ``connect`` takes them (not ``resend``).
        consumer_options: keywords as ``listen`` takes them.

    Raises:
        TypeError: an options argument that is not a mapping (naming it),
            or an option as ``connect`` and ``listen`` raise it.
        ValueError: ``resend`` in ``sender_options``; an option out of its
            range.
    """
    return _blobpipe._loopback_pair(_options_dict("sender_options", sender_options),
                                    _options_dict("consumer_options", consumer_options))


def _options_dict(name: str, options: Any) -> dict:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"{name}: expected a dict of option names to values, "
                        f"not {type(options).__name__}")
    return dict(options)


# ---- asyncio: Consumer.__anext__ returns _anext(consumer) ----

async def _anext(consumer: "_blobpipe.Consumer") -> Any:
    while True:
        ev = consumer._poll()  # StopAsyncIteration at the end
        if ev is not None:
            return ev
        await _readable(consumer)


async def _readable(consumer: "_blobpipe.Consumer") -> None:
    """Waits until the consumer's background thread has queued an event: it
    writes an eventfd that the running loop watches, so neither thread
    blocks the other and the loop thread alone runs Python."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    fd = consumer._arm()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)
        consumer._disarm(fd)  # this waiter's own fd (one each), back for reuse
