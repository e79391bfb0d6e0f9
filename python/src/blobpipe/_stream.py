"""Streaming from Python: connect, listen, loopback_pair, and asyncio iteration.

The classes (Sender, Blob, Consumer, Listener, EntryReady, BlobComplete,
BlobAborted, ReceivedBuffer) are the extension module's; this module parses
URLs and gives the factories their public names.

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
from typing import Any, Optional, Tuple

from . import _blobpipe
from ._errors import URLError

__all__ = ["connect", "listen", "loopback_pair", "parse_url"]

SCHEMES = ("tcp", "ucx")


def parse_url(url: str, *, listening: bool = False) -> Tuple[str, str, int]:
    """``(scheme, host, port)`` of ``scheme://host:port``.

    The scheme is ``tcp`` or ``ucx``; the host a name, an IPv4 address or an
    IPv6 one in brackets (``tcp://[::1]:5555``; not for ``ucx``, whose tcp
    transport is IPv4 only in UCX 1.13); the port 1..65535, or 0 when
    ``listening`` (a free port, which the Listener reports).

    Raises:
        URLError (a ValueError) naming the part that is wrong (``.part``:
        ``"scheme"``, ``"host"`` or ``"port"``).
    """
    if not isinstance(url, str):
        raise TypeError(f"the URL must be a str, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise URLError(f"URL {url!r} has no scheme: write tcp://host:port or ucx://host:port",
                       part="scheme")
    if scheme not in SCHEMES:
        raise URLError(f"URL {url!r}: scheme {scheme!r} is not one of {', '.join(SCHEMES)}",
                       part="scheme")
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or not tail.startswith(":"):
            raise URLError(f"URL {url!r}: an IPv6 host is written [address]:port", part="host")
        port_text = tail[1:]
    else:
        host, colon, port_text = rest.rpartition(":")
        if not colon:
            raise URLError(f"URL {url!r} has no port: write {scheme}://host:port", part="port")
        if ":" in host:
            raise URLError(f"URL {url!r}: write an IPv6 host in brackets, "
                           f"{scheme}://[{host}]:{port_text}", part="host")
    if not host:
        raise URLError(f"URL {url!r} has no host", part="host")
    if scheme == "ucx" and ":" in host and not (host.lower().startswith("::ffff:") and "." in host):
        # As the C++ side (lib/transport/ucx): UCX 1.13's tcp transport
        # cannot connect over IPv6; a v4-mapped address is its IPv4 one.
        raise URLError(f"URL {url!r}: UCX 1.13's tcp transport cannot connect over IPv6 "
                       "(docs/ucx.md); use an IPv4 address", part="host")
    if "/" in port_text or "/" in host:
        raise URLError(f"URL {url!r}: nothing may follow host:port", part="port")
    if not port_text.isdigit() or not port_text.isascii():
        raise URLError(f"URL {url!r}: port {port_text!r} is not a number", part="port")
    port = int(port_text)
    low = 0 if listening else 1
    if not low <= port <= 65535:
        raise URLError(f"URL {url!r}: port {port} is not within {low}..65535"
                       + ("" if listening else " (port 0 only to listen)"), part="port")
    return scheme, host, port


def connect(url: str, **options: Any) -> "_blobpipe.Sender":
    """Connects to a consumer at ``url`` and returns a started Sender.

    Args:
        url: ``tcp://host:port`` or ``ucx://host:port`` (UCX picks its
            transports from ``UCX_TLS``; docs/ucx.md).
        options (keywords):
            chunk_bytes: largest data frame proposed, bytes (default 1 MiB;
                the consumer may lower it).
            inline_bytes: copy threshold proposed, bytes (default 64 KiB, at
                most 1 MiB): ``emit`` copies entries up to it and holds
                larger ones.
            max_queued_bytes: copied bytes the C++ sender queues for its
                writer before it waits, bytes (default 4 MiB).
            queue_bytes: bytes emitted and not yet taken by the C++ sender
                beyond which ``emit`` blocks (default: the consumer's window).
            stall_timeout: seconds the sender waits on a consumer that
                sends nothing and reads nothing (None or 0: no limit), then
                TimedOutError (a resend session reconnects instead).
            handshake_timeout: seconds the handshake may take once
                connected (default 10; None or 0: no limit), then
                TimedOutError (a resend session tries again).
            resend: True for a resend session: every blob is kept until the
                consumer acknowledges it, and a broken connection is made
                again and the unacknowledged blobs resent (each reaches the
                application once). Costs a copy of every byte.
            unacked_bytes, max_attempts, retry_delay, max_retry_delay:
                resend session limits (bytes, count, seconds, seconds;
                defaults 256 MiB, 8, 0.01, 1).

    Waits for the connection and the handshake (Ctrl-C interrupts).

    Raises:
        URLError: a URL that cannot be used (see ``parse_url``).
        TypeError, ValueError: an unknown option, or a value out of range.
        PeerFailedError: nobody listens there, the host does not resolve.
        ProtocolViolationError: the peer is not a blobpipe consumer.
        PeerClosedError: the peer closed during the handshake.
    """
    scheme, host, port = parse_url(url)
    return _blobpipe._connect(scheme, host, port, url, options)


def listen(url: str, **options: Any) -> "_blobpipe.Listener":
    """Listens at ``url`` (port 0: a free port, see ``Listener.port``).

    Args:
        url: ``tcp://address:port`` (``0.0.0.0`` for every interface) or
            ``ucx://address:port`` (IPv4 only).
        options (keywords), for every Consumer it accepts:
            window_bytes: the most bytes the consumer holds (entries not yet
                freed, plus a tail being checked), bytes (default 64 MiB).
            allow_pickle: False gives kind ``p`` entries as bytes instead of
                unpickling them (unpickling runs code chosen by the sender:
                pass False for peers you do not trust).
            stall_timeout, idle_timeout: seconds without bytes from the
                sender while it owes some (a blob is open), or at all, after
                which the stream ends with TimedOutError (None or 0: none).
            handshake_timeout: seconds an accepted connection's handshake
                may take (default 10; None or 0: no limit); past it
                accept() raises TimedOutError for that connection.
            max_chunk_bytes, inline_bytes, max_key_bytes, max_meta_bytes,
            max_entry_bytes, max_tail_bytes, max_blob_bytes (bytes),
            max_open_blobs, max_entries_per_blob, payload_window (counts),
            recycle_bytes (bytes): as ``consumer_options`` in
            ``blobpipe/pipeline/consumer.hpp``.

    Raises:
        URLError, TypeError, ValueError: as ``connect``.
        PeerFailedError: the address cannot be bound (in use, not local).
        Error (category ``invalid_argument``): an address that does not
            parse.
    """
    scheme, host, port = parse_url(url, listening=True)
    return _blobpipe._listen(scheme, host, port, url, options)


def loopback_pair(*, sender_options: Optional[dict] = None,
                  consumer_options: Optional[dict] = None
                  ) -> Tuple["_blobpipe.Sender", "_blobpipe.Consumer"]:
    """A Sender and a Consumer joined in this process by blobpipe's in-process
    transport (no socket: bytes are copied once, from the sender's buffers
    into the consumer's), each with its own background thread. For tests.

    Args:
        sender_options: keywords as ``connect`` takes them (not ``resend``).
        consumer_options: keywords as ``listen`` takes them.
    """
    return _blobpipe._loopback_pair(dict(sender_options or {}), dict(consumer_options or {}))


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
        consumer._disarm()
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)
