"""blobpipe's exceptions.

Every failure blobpipe reports carries the C++ library's error category
(``blobpipe::errc``, as ``errc_name`` spells it, and as the CLI prints it in
``blobpipe: CATEGORY: message``) in ``.category``, and a one-line message in
``str(e)``. The class says which family the category belongs to, so that
code written against the reference codec, which raises ``ValueError`` for a
bad blob, keeps working: ``FormatError`` is a ``ValueError``.

Streaming (``Sender``, ``Consumer``, ``Listener``) raises a ``StreamError``
subclass per transport category (``ClosedError``, ``PeerClosedError``,
``PeerFailedError``, ``ProtocolViolationError``, ``TimedOutError``,
``AbortedError``; ``ListenError``, an ``OSError``, for an address
``listen()`` cannot use), ``URLError`` (a ``ValueError``) for a URL it cannot
use, and ``ForkedError`` (a ``ClosedError``) for an object used in a child
process forked after it was made.
"""

from __future__ import annotations

#: Categories of bytes that are not a valid blob, or of codec arguments
#: that cannot be encoded (``too_large``: a blob of 4 GiB or more, which the
#: v3 footer cannot address; ``buffer_too_small``: ``out`` is shorter than
#: the blob; ``invalid_argument``: e.g. keys and values of different
#: lengths).
FORMAT_CATEGORIES = frozenset({
    "too_small", "bad_footer", "index_out_of_range", "malformed_index",
    "entry_out_of_range", "shape_mismatch", "unknown_kind", "unknown_dtype",
    "too_large", "buffer_too_small", "invalid_argument",
})


#: Categories of the streaming classes (blobpipe::errc's transport codes):
#: ``closed`` (this side closed the object), ``peer_closed`` (the peer ended
#: the connection), ``peer_failed`` (connection refused, reset, or an I/O
#: failure), ``protocol_violation`` (the peer broke docs/wire.md),
#: ``timed_out`` (a configured timeout expired), ``aborted`` (the producer
#: abandoned the blob).
STREAM_CATEGORIES = frozenset({
    "closed", "peer_closed", "peer_failed", "protocol_violation", "timed_out", "aborted",
})


class Error(Exception):
    """Base class of blobpipe's errors.

    Attributes:
        category: the blobpipe error category, e.g. ``"bad_footer"``.
    """

    def __init__(self, message: str, category: str) -> None:
        super().__init__(message)
        self.category = category

    def __reduce__(self):
        return (type(self), (str(self), self.category))


class FormatError(Error, ValueError):
    """Bytes that are not a valid NVDP blob (footer, index, entry rows), or
    arguments the codec cannot encode. ``.category`` is one of
    ``FORMAT_CATEGORIES``."""


class FormatTypeError(FormatError, TypeError):
    """A FormatError where the reference raises TypeError for the same input:
    an ndarray entry whose dtype numpy cannot parse (``numpy.dtype`` raises
    TypeError there), an ``Entry.from_meta`` field that ``int()`` refuses by
    type, a structured array holding objects given to ``plan``, and
    ``read_index`` of an index (or a row, or a shape) that is no list where
    the reference's row unpacking raises TypeError. ``except FormatError``
    and ``except TypeError`` both catch it."""


class FormatKeyError(FormatError, KeyError):
    """A FormatError where the reference raises KeyError: ``Entry.from_meta``
    of a meta dict without an ``"o"``, ``"n"`` or ``"k"`` field."""

    def __str__(self) -> str:  # KeyError would quote the message
        return Exception.__str__(self)


class FormatRuntimeError(FormatError, RuntimeError):
    """A FormatError where the reference raises RuntimeError (torch does): a
    tensor entry whose bytes are whole elements but not its shape's number
    (``Tensor.view`` refuses), a sparse CSR/CSC tensor given to ``plan``
    (no dense bytes)."""


#: error_for's third argument: the built-in the reference raises there.
_FORMAT_ALSO = {"TypeError": FormatTypeError, "KeyError": FormatKeyError,
                "RuntimeError": FormatRuntimeError}


class BufferTypeError(BufferError, TypeError):
    """A buffer given to the codec is not C-contiguous, or ``out`` given to
    ``write``/``write_tail`` is read-only: the one error of every codec
    function for either (``write``, ``write_tail``, ``read_index``,
    ``footer_is_valid``, ``footer_tag``, ``decode_entry``,
    ``decode_entries``, ``Entry.from_meta``). A BufferError as Python's
    buffer protocol and the reference's ``decode_entry`` report it, and a
    TypeError as the reference's ``memoryview.cast`` reports it
    (``read_index``, the footer functions). The message is the exporter's
    (``ndarray is not C-contiguous``)."""


class FileError(Error, OSError):
    """A file that cannot be opened, seeked or read, or is not a regular file
    (``read_index_file``). ``.category`` is ``"io"``."""


class StreamError(Error):
    """A failure of a Sender, Consumer or Listener, or of their connection.
    ``.category`` is one of ``STREAM_CATEGORIES``; the subclass says which."""


class ClosedError(StreamError):
    """The object was closed on this side (``close()``, ``shutdown()``, the end
    of its ``with`` block), before or while the call waited. ``closed``."""


class PeerClosedError(StreamError, ConnectionError):
    """The peer ended the connection before the stream's orderly end (a
    sender that went away without ``shutdown()``, or a consumer that closed).
    ``peer_closed``."""


class PeerFailedError(StreamError, ConnectionError):
    """The connection could not be made (refused, host unknown) or broke
    (reset, an I/O error). ``peer_failed``."""


class ListenError(StreamError, OSError):
    """``listen()`` cannot listen at its address on this host: the address is
    in use, not one of this host's, or not permitted (an ``OSError``, as a
    socket's ``bind`` raises; no peer is involved). ``.category`` is the
    library's (``peer_failed``)."""


class ProtocolViolationError(StreamError):
    """The peer sent bytes that break blobpipe's wire protocol (docs/wire.md),
    or an incompatible handshake. ``protocol_violation``."""


class TimedOutError(StreamError, TimeoutError):
    """A configured timeout expired (``stall_timeout``, ``idle_timeout``,
    ``accept(timeout=...)``). ``timed_out``."""


class AbortedError(StreamError):
    """The producer abandoned the blob. ``aborted``."""


class ForkedError(ClosedError):
    """The object was made before ``os.fork()`` and is used in the child: its
    background thread does not exist there. Make a new one in the child.
    ``.category`` is ``"closed"``."""

    def __init__(self, message: str, category: str = "closed") -> None:
        super().__init__(message, category)


class URLError(Error, ValueError):
    """A URL ``connect``/``listen`` cannot use: no ``scheme://``, a scheme other
    than ``tcp`` or ``ucx``, no host, or a port that is not 0..65535 (0 only
    to listen). The message names the part; ``.part`` is ``"scheme"``,
    ``"host"`` or ``"port"``. ``.category`` is ``"invalid_argument"``."""

    def __init__(self, message: str, category: str = "invalid_argument",
                 part: str = "") -> None:
        super().__init__(message, category)
        self.part = part

    def __reduce__(self):
        return (type(self), (str(self), self.category, self.part))


_STREAM_CLASSES = {
    "closed": ClosedError,
    "peer_closed": PeerClosedError,
    "peer_failed": PeerFailedError,
    "protocol_violation": ProtocolViolationError,
    "timed_out": TimedOutError,
    "aborted": AbortedError,
}


def error_for(category: str, message: str, also: str | None = None) -> Error:
    """The exception for a blobpipe error: used by the extension module.
    ``also`` names the built-in exception the reference raises for the same
    input ("TypeError", "KeyError", "RuntimeError"), which a format error
    then also is."""
    if category in FORMAT_CATEGORIES:
        return _FORMAT_ALSO.get(also, FormatError)(message, category)
    if category == "io":
        return FileError(message, category)
    cls = _STREAM_CLASSES.get(category)
    if cls is not None:
        return cls(message, category)
    return Error(message, category)
