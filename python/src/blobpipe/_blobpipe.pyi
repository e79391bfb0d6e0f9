"""Type stubs of blobpipe's extension module (python/ext). Its classes
carry their full docstrings at run time (help(blobpipe.Sender)); the
functions are re-exported with theirs, units, shapes and errors, by the
package's __init__.py and _stream.py. Sizes are in bytes, timeouts in
seconds, shapes in elements."""

from types import TracebackType
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Tuple, Type, Union)

from _typeshed import ReadableBuffer, WriteableBuffer

ALIGN: int
MAGIC: int
VERSION: int
FOOTER_SIZE: int
FOOTER_V2_SIZE: int
NO_TAG: bytes
KIND_TENSOR: str
KIND_NUMPY: str
KIND_PICKLE: str

class Entry:
    def __init__(self, key: str, off: int, len: int, kind: str, dtype: Optional[str],
                 shape: Optional[Tuple[int, ...]]) -> None: ...
    @property
    def key(self) -> str: ...
    @property
    def off(self) -> int: ...
    @property
    def len(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def dtype(self) -> Optional[str]: ...
    @property
    def shape(self) -> Optional[Tuple[int, ...]]: ...
    def meta(self) -> dict[str, Any]: ...
    def meta_msgpack(self) -> bytes: ...
    @staticmethod
    def from_meta(key: str, m: Union[Mapping[str, Any], ReadableBuffer]) -> Entry: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> Tuple[type, Tuple[Any, ...]]: ...
    def __setstate__(self, state: Tuple[Any, ...]) -> None: ...

    # Set by blobpipe/__init__.py: the dataclass metadata of a frozen
    # dataclass with the same fields (dataclasses.fields/replace/asdict, match).
    __dataclass_fields__: Dict[str, Any]
    __match_args__: Tuple[str, ...]

class _NativePlan:
    """blobpipe's C++ layout behind a BlobPlan made by plan() (blobpipe._plan)."""
    @property
    def keys(self) -> list[str]: ...
    @property
    def entries(self) -> list[Entry]: ...
    @property
    def index_bytes(self) -> bytes: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def tag(self) -> bytes: ...
    @property
    def index_off(self) -> int: ...
    def __len__(self) -> int: ...
    def _buffers(self) -> Tuple[list[Optional[memoryview]], list[Any], list[int]]: ...

def plan(keys: Sequence[Any], values: Sequence[Any], tag: Any = ...) -> _NativePlan: ...
def write(p: _NativePlan, out: WriteableBuffer) -> None: ...
def write_tail(p: _NativePlan, out: WriteableBuffer) -> None: ...
def read_index(blob: ReadableBuffer) -> list[Entry]: ...
def read_index_file(f: Any, off: int = 0, nbytes: int = 0) -> list[Entry]: ...
def decode_entry(view: ReadableBuffer, e: Entry, *, allow_pickle: bool = True) -> Any: ...
def decode_entries(blob: ReadableBuffer, entries: Sequence[Entry], *,
                   allow_pickle: bool = True) -> list[Any]: ...
def materialize(v: Any) -> Any: ...
def _entries(raw: ReadableBuffer) -> list[Entry]: ...
def _entry_fits(key: Any, off: Any, len: Any, kind: Any, dtype: Any, shape: Any) -> bool: ...
def footer_is_valid(blob_tail: ReadableBuffer) -> bool: ...
def footer_tag(tail: ReadableBuffer) -> Optional[bytes]: ...


# ---- streaming (python/ext/{sender,consumer,connect,entry_ready,received}.cpp) ----

class Blob:
    """One blob being streamed (Sender.open_blob); a context manager that
    finishes it, or aborts it naming the exception (its repr)."""
    @property
    def tag(self) -> bytes:
        """The blob's 16-byte tag."""
    def emit(self, key: Any, value: Any, *, copy: bool = True) -> None:
        """Adds entry ``str(key)``; returns without waiting for the network
        (entries up to Sender.inline_bytes copied, and torch tensors whose
        bytes torch may reallocate unless ``copy=False``, the caller's
        promise not to reallocate them until finish() or flush() returns;
        larger ones held until a later call on the sender). Blocks only
        while the queue is full.
        Raises FormatError (value refused, a key longer than
        Sender.max_key_bytes, or an entry whose meta is longer than
        Sender.max_meta_bytes: nothing sent, the blob stays usable),
        ClosedError, or the connection's StreamError."""
    def emit_many(self, keys: Sequence[Any], values: Sequence[Any], *,
                  copy: bool = True) -> None:
        """emit(keys[i], values[i]) for each i, in one call. Raises as emit,
        and ValueError (FormatError invalid_argument) when the lengths
        differ (then nothing is emitted)."""
    def finish(self) -> None:
        """Ends the blob (index and footer queued behind its entries).
        Raises as emit."""
    def abort(self, reason: str = "") -> None:
        """Abandons the blob: the consumer yields BlobAborted(reason)
        (reason cut to 4 KiB). Raises ClosedError when it already ended."""
    def __enter__(self) -> Blob: ...
    def __exit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool: ...

class Sender:
    """Streams blobs to one consumer (blobpipe.connect, loopback_pair); a
    context manager that shuts down; on an exception it aborts the blobs
    still open, naming the exception (its repr), then closes."""
    @property
    def chunk_bytes(self) -> int:
        """Negotiated largest data frame payload, bytes."""
    @property
    def inline_bytes(self) -> int:
        """Negotiated copy threshold, bytes."""
    @property
    def window_bytes(self) -> int:
        """The consumer's window, bytes."""
    @property
    def max_key_bytes(self) -> int:
        """The consumer's key limit, bytes (UTF-8): emit refuses longer keys."""
    @property
    def max_meta_bytes(self) -> int:
        """The consumer's limit on an entry's meta (its index row), bytes:
        emit refuses an entry whose meta is longer in the form it would
        travel in (the compact form: 12 + 8 bytes per dimension)."""
    @property
    def queue_bytes(self) -> int:
        """emit() blocks while more than this many bytes are queued
        (connect()'s queue_bytes; by default the consumer's window, at
        most 64 MiB whatever window it grants)."""
    @property
    def _waiting(self) -> int: ...
    def open_blob(self, tag: Any = None) -> Blob:
        """A new blob; ``tag`` bytes-like (cut or zero-padded to 16 bytes),
        None for a random uuid4 tag. In a resend session equal tags are one
        blob to the consumer (the second is dropped): keep them unique.
        Raises ClosedError, StreamError."""
    def send_blob(self, keys: Sequence[Any], values: Sequence[Any],
                  tag: Any = None, *, copy: bool = True) -> bytes:
        """A whole blob in one call (open_blob, emit of each entry, finish),
        its finish queued and not waited for; returns its 16-byte tag.
        Raises an earlier send_blob's deferred failure before queueing
        anything, then as emit for what is refused in this call (the blob
        then aborted). A failure the background thread meets for this
        blob (the consumer refusing an entry), during the call or after,
        never raises here: it aborts the blob and is raised once by the
        next call on this Sender."""
    def flush(self) -> None:
        """Waits until everything queued was handed to the transport.
        Raises the connection's StreamError."""
    def shutdown(self) -> None:
        """Orderly close: sends what is queued and waits until the consumer
        read it all. Raises the connection's StreamError; closed either way."""
    def close(self) -> None:
        """Closes now (blobs in flight are aborted; values held with
        copy=False are released before it returns); never raises."""
    def stats(self) -> Dict[str, int]:
        """Counters: entries_sent, bytes_sent, credit_waits, queue_waits,
        copies_reused, copy_bytes_kept, ..."""
    def __enter__(self) -> Sender: ...
    def __exit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool: ...

class ReceivedBuffer:
    """The bytes of one received entry (buffer protocol: 1-d, format "B",
    len(b) bytes, writable). Holding it keeps the bytes and their window
    credit."""
    @property
    def address(self) -> int:
        """Address of the first byte."""
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class EntryReady:
    """An entry whose bytes have all arrived; unpacks as
    ``tag, entry, value = ev``. Holding it, its value or its buffer keeps
    the bytes and their share of the consumer's window."""
    __match_args__ = ("tag", "entry", "value")
    @property
    def tag(self) -> bytes:
        """The blob's 16-byte tag."""
    @property
    def entry(self) -> Entry:
        """The index row: key, off and len (bytes), kind, dtype, shape."""
    @property
    def value(self) -> Any:
        """Zero-copy value: torch.Tensor (kind t; numpy.ndarray or RawEntry
        where torch lacks the dtype), numpy.ndarray (n), the unpickled
        object (p; bytes with allow_pickle=False)."""
    @property
    def buffer(self) -> ReceivedBuffer:
        """The entry's entry.len bytes."""
    @property
    def key(self) -> str: ...
    @property
    def blob_id(self) -> int: ...
    @property
    def index(self) -> int:
        """The entry's position in its blob."""
    def __iter__(self) -> Iterator[Any]: ...

class BlobComplete:
    """A blob whose tail arrived and checked out."""
    __match_args__ = ("tag",)
    @property
    def tag(self) -> bytes: ...
    @property
    def blob_id(self) -> int: ...
    @property
    def nbytes(self) -> int:
        """The whole blob's size as written, bytes."""
    @property
    def entries(self) -> list[Entry]: ...

class BlobAborted:
    """A blob that will not complete."""
    __match_args__ = ("tag", "reason")
    @property
    def tag(self) -> bytes: ...
    @property
    def blob_id(self) -> int: ...
    @property
    def reason(self) -> str:
        """The producer's reason (Blob.abort), or what broke."""
    @property
    def category(self) -> str:
        """"aborted", or the connection's error category."""
    @property
    def resend(self) -> bool:
        """Resend sessions: True when the sender will send the blob again."""

# The events a Consumer yields (a name for these stubs only).
_Event = Union[EntryReady, BlobComplete, BlobAborted]

class Consumer:
    """Receives blobs from one sender (Listener.accept, loopback_pair):
    ``for ev in consumer`` or ``async for ev in consumer``, ending at the
    sender's shutdown or after close(); a connection that fails raises its
    StreamError after the BlobAborted events of its open blobs."""
    @property
    def chunk_bytes(self) -> int:
        """Negotiated largest data frame payload, bytes."""
    @property
    def window_bytes(self) -> int:
        """This consumer's window, bytes."""
    @property
    def _waiting(self) -> int: ...
    def __iter__(self) -> Consumer: ...
    def __next__(self) -> _Event: ...
    def __aiter__(self) -> Consumer: ...
    async def __anext__(self) -> _Event: ...
    def _poll(self) -> Optional[_Event]: ...
    def _arm(self) -> int: ...
    def _disarm(self, fd: int) -> None: ...
    def close(self) -> None:
        """Closes now; a blocked iteration in another thread wakes and
        ends. Received values stay valid. Idempotent."""
    def stats(self) -> Dict[str, int]:
        """Counters: buffered_bytes, entries_received, blobs_completed, ..."""
    def __enter__(self) -> Consumer: ...
    def __exit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool: ...

class Listener:
    """Accepts connections (blobpipe.listen); its Consumers share its
    background thread and outlive it."""
    @property
    def port(self) -> int:
        """The bound port (the one chosen for port 0)."""
    @property
    def url(self) -> str:
        """The URL a peer connects to (a host name resolved, the bound port)."""
    def accept(self, timeout: Optional[float] = None) -> Consumer:
        """The next connection's Consumer; timeout in seconds (None: none).
        Raises TimedOutError, ClosedError, ProtocolViolationError,
        PeerClosedError, PeerFailedError."""
    def close(self) -> None:
        """Stops listening; accepted Consumers go on. Idempotent."""
    def __enter__(self) -> Listener: ...
    def __exit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool: ...

def _connect(url: str, options: Dict[str, Any]) -> Sender: ...
def _listen(url: str, options: Dict[str, Any]) -> Listener: ...
def _parse_url(url: str, listening: bool) -> Tuple[str, str, int]: ...
def _loopback_pair(sender_options: Dict[str, Any],
                   consumer_options: Dict[str, Any]) -> Tuple[Sender, Consumer]: ...
def _cpp_stream_send(port: int, blobs: int,
                     entries: List[Tuple[str, str, str, List[int], Any]]) -> float:
    """bench/python_stream.py's C++ sender: streams ``blobs`` blobs of
    ``entries`` to 127.0.0.1:port; returns the first emit's
    time.monotonic() seconds."""
def _cpp_stream_consume(on_port: Callable[[int], Any]) -> Tuple[int, int, float]:
    """bench/python_stream.py's C++ consumer: (entries, blobs, the last
    blob_complete's time.monotonic() seconds)."""
