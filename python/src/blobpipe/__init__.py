"""blobpipe: NVDP blobs from Python, byte-compatible with the reference codec.

A drop-in for ``nemo_rl.data_plane.nixl.blob_format`` (the reference): code
written against it works with ``import blobpipe as bf``, with the same names,
arguments and bytes, and the work done by blobpipe's C++ codec::

    import blobpipe as bf
    import numpy as np
    import torch

    p = bf.plan(["ids", "meta"], [torch.arange(6).view(2, 3), {"idx": 0}])
    buf = np.zeros(p.nbytes, dtype=np.uint8)
    bf.write(p, buf)
    for e in bf.read_index(buf):
        v = bf.decode_entry(memoryview(buf)[e.off : e.off + e.len], e)

A blob is ``entry 0 | pad | entry 1 | ... | index (msgpack) | footer (32 B)``,
entries at 64-byte aligned offsets (``docs/format.md`` in the repository).

Values are stored as the reference stores them: a torch tensor as kind
``t`` (its raw bytes in C order, dtype as torch names it), a numpy array as
kind ``n`` (dtype as ``dtype.str``, any byte order), anything else pickled
(kind ``p``, ``pickle.HIGHEST_PROTOCOL``). numpy is required; torch is
optional (see ``decode_entry``).

Streaming, over the same wire protocol as the C++ library (a Python worker
can feed a C++ trainer, and the other way round)::

    with bf.connect("tcp://trainer:5555") as sender:       # Sender
        with sender.open_blob() as blob:
            blob.emit("0@input_ids", torch.arange(6))

    with bf.listen("tcp://0.0.0.0:5555") as listener:      # Listener
        with listener.accept() as consumer:                  # Consumer
            for ev in consumer:                              # or async for
                if isinstance(ev, bf.EntryReady):
                    use(ev.entry.key, ev.value)              # zero-copy view

``loopback_pair()`` joins a Sender and a Consumer in one process.
Background threads, waiting and fork: see ``blobpipe._stream``.

Errors: ``FormatError`` (a ``ValueError``) for bytes that are not a valid
blob and for arguments the codec refuses, ``FileError`` (an ``OSError``)
for files, ``StreamError`` subclasses for connections (``ClosedError``,
``PeerClosedError``, ``PeerFailedError``, ``ProtocolViolationError``,
``TimedOutError``, ``AbortedError``; ``ForkedError``; ``ListenError``, also
an ``OSError``, for an address ``listen()`` cannot use), ``URLError`` (a
``ValueError``) for URLs; all carry blobpipe's error category in
``.category``.

Sources: the reference's ``blob_format.py``; blobpipe's C++ headers
``blobpipe/format/*.hpp``.
"""

# Imports are underscored: the public namespace is __all__ (dir(blobpipe)
# shows nothing else but dunders and the underscored modules).
from typing import Any as _Any, Optional as _Optional, Sequence as _Sequence

import operator as _operator
import os as _os
import numpy as _np

# Loading the extension loads UCX, whose library constructor replaces the
# handlers of fatal signals (SIGSEGV, ...) with its own, so Python's
# faulthandler would print a UCX backtrace instead of Python's traceback.
# Unless the user chose otherwise, UCX leaves those signals to Python.
_os.environ.setdefault("UCX_HANDLE_ERRORS", "none")

# The extension module loads these two, so they come first.
from ._errors import (AbortedError, ClosedError, Error, FileError, ForkedError, FormatError,
                      ListenError, PeerClosedError, PeerFailedError, ProtocolViolationError,
                      StreamError, TimedOutError, URLError)
from ._raw import RawEntry
from . import _blobpipe
from ._blobpipe import (Blob, BlobAborted, BlobComplete, Consumer, Entry, EntryReady, Listener,
                        ReceivedBuffer, Sender)
from ._plan import (_FOOTER_FMT, _FOOTER_V2_FMT, BlobPlan, _align_up, _entries, _footer, _integer,
                    _native_of, _numpy_bytes, _tensor_bytes, _torch_dtype, _write_fields,
                    _write_tail_fields, encode_value)
from ._stream import connect, listen, loopback_pair, parse_url


def _entry_as_dataclass() -> None:
    # Entry stays the extension type (a plain CPython type: read_index makes
    # one per row in C++), and answers to the dataclasses module as the
    # reference's frozen dataclass does: is_dataclass, fields, replace
    # (Entry(**fields)), asdict/astuple, match by position (__match_args__)
    # and keyword. Its field descriptions are those of a frozen dataclass
    # with the same fields, made here once.
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Entry:  # noqa: F811 - only its dataclass metadata is kept
        key: str
        off: int
        len: int
        kind: str
        dtype: _Optional[str]
        shape: _Optional[tuple]

    native = _blobpipe.Entry
    for name in ("__dataclass_fields__", "__dataclass_params__", "__match_args__"):
        setattr(native, name, getattr(Entry, name))
    # inspect.signature(Entry): the dataclass's fields.
    import inspect
    native.__signature__ = inspect.signature(Entry)

    # Frozen as the dataclass is: assigning or deleting any attribute raises
    # dataclasses.FrozenInstanceError (an AttributeError) with its message.
    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    native.__setattr__ = __setattr__
    native.__delattr__ = __delattr__

    # The dataclass takes any value for any field. The native Entry holds
    # what a blob's index can (_blobpipe._entry_fits): key a str, off and
    # len ints in 0..2**64-1, kind one ASCII character, dtype None or a str,
    # shape None or a tuple of ints. For other fields Entry(...) (its C
    # __new__) makes a _LooseEntry: an Entry (a subclass) that keeps them
    # as given, and that compares, hashes, prints, pickles and answers to
    # the dataclasses module as the reference's dataclass would with the
    # same fields. decode_entry and meta_msgpack refuse it (FormatError: no
    # index holds such a row).


#: Whether fields are a row a blob index holds (the native Entry's own check).
_fits = _blobpipe._entry_fits


def _index_row(fields):
    """The row a blob index would hold for ``fields`` whose integers are not
    ``int`` (numpy integers, say), whose strings are a ``str`` subclass
    (``numpy.str_``) or whose shape is a list or a 1-d array of integers,
    as the reference's decode_entry reads them; None when there is none."""
    key, off, len_, kind, dtype, shape = fields
    try:
        off, len_ = _operator.index(off), _operator.index(len_)
        if shape is not None:
            if not isinstance(shape, (tuple, list, _np.ndarray)) or getattr(shape, "ndim", 1) != 1:
                return None
            shape = tuple(_operator.index(d) for d in shape)
    except TypeError:
        return None
    key, kind, dtype = (str(s) if isinstance(s, str) else s for s in (key, kind, dtype))
    row = (key, off, len_, kind, dtype, shape)
    return row if _fits(*row) else None


_entry_as_dataclass()


class _LooseEntry(Entry):
    """An ``Entry`` whose fields no blob index holds (``Entry(...)`` makes
    one for such fields, as the reference's dataclass takes any value): the
    fields as given, compared, hashed and printed as the dataclass would."""

    @classmethod
    def _make(cls, fields):
        # Bare: a placeholder native part no index holds (off 2**64-1), never decoded.
        self = _blobpipe.Entry.__new__(cls)
        row = _index_row(fields)
        if row is not None:  # decoded as that row (numpy integers, a list shape)
            self.__setstate__(row)
            object.__setattr__(self, "_index_row", True)
        object.__setattr__(self, "_fields", tuple(fields))
        return self

    def __init__(self, *args, **kwargs):  # made by _make; Entry(...) calls this again
        pass

    key = property(lambda self: self._fields[0])
    off = property(lambda self: self._fields[1])
    len = property(lambda self: self._fields[2])
    kind = property(lambda self: self._fields[3])
    dtype = property(lambda self: self._fields[4])
    shape = property(lambda self: self._fields[5])

    def __eq__(self, other):
        if isinstance(other, Entry):
            return self._fields == (other.key, other.off, other.len, other.kind, other.dtype,
                                    other.shape)
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(self._fields)

    def __repr__(self):
        return "Entry(" + ", ".join(f"{n}={v!r}" for n, v in zip(
            ("key", "off", "len", "kind", "dtype", "shape"), self._fields)) + ")"

    def __reduce__(self):
        return (Entry, self._fields)

    def meta(self):
        """The location map, as ``Entry.meta``."""
        key, off, len_, kind, dtype, shape = self._fields
        return {"o": off, "n": len_, "k": kind, "d": dtype, "s": list(shape or ())}

    def meta_msgpack(self):
        raise FormatError(f"no blob index holds the row {self!r}", "invalid_argument")

# The C++ library's version (version.bzl, the one place it is written).
__version__ = _blobpipe.__version__

# The reference's constants (documented where they are defined, in _plan).
from ._plan import (ALIGN, FOOTER_SIZE, FOOTER_V2_SIZE, KIND_NUMPY, KIND_PICKLE, KIND_TENSOR,
                    MAGIC, NO_TAG, VERSION)

__all__ = [
    "ALIGN", "MAGIC", "VERSION", "FOOTER_SIZE", "FOOTER_V2_SIZE", "NO_TAG",
    "KIND_TENSOR", "KIND_NUMPY", "KIND_PICKLE",
    "Entry", "BlobPlan", "RawEntry", "Error", "FormatError", "FileError",
    "plan", "write", "write_tail", "read_index", "read_index_file",
    "decode_entry", "decode_entries", "materialize", "footer_is_valid", "footer_tag",
    "encode_value",
    # streaming
    "connect", "listen", "loopback_pair", "parse_url",
    "Sender", "Blob", "Consumer", "Listener", "EntryReady", "BlobComplete", "BlobAborted",
    "ReceivedBuffer",
    "StreamError", "ClosedError", "PeerClosedError", "PeerFailedError",
    "ProtocolViolationError", "TimedOutError", "AbortedError", "ForkedError", "ListenError",
    "URLError",
]


def plan(keys: _Sequence[_Any], values: _Sequence[_Any], tag: _Any = NO_TAG) -> BlobPlan:
    """Lays out a blob of ``values`` named by ``keys`` (``str(key)`` each).

    Reads only the values' descriptions (dtype, shape, where their bytes
    are); the bytes are copied later by ``write``, so the values must not
    change until then (the plan keeps them alive, and a torch tensor's
    storage too: ``set_`` on it changes nothing the plan writes). A tensor
    that torch reallocated meanwhile (``resize_`` to a larger size) is
    refused by ``write``. Per value:

    - ``torch.Tensor`` (not nested, not sparse COO): kind ``t``, dtype
      ``str(t.dtype)`` without ``torch.``, shape ``tuple(t.shape)`` in
      elements. A tensor off the CPU (CUDA) is copied to host here; a
      non-contiguous one is stored contiguous (gathered in C order by
      ``write``); conjugate/negative views are resolved.
    - ``numpy.ndarray`` without object dtype: kind ``n``, dtype
      ``a.dtype.str`` (any byte order, as is), non-contiguous stored
      contiguous.
    - ``RawEntry`` (what ``decode_entry`` gives for a dtype no library here
      has): its kind, dtype and shape over its bytes, so that such an entry
      re-encodes unchanged. blobpipe's own type, which the reference never
      sees.
    - anything else, object arrays included: kind ``p``, the bytes of
      ``pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)``.

    Args:
        keys: one per value; keys need not be unique.
        values: the values, in blob order.
        tag: the blob's tag, any bytes-like object: ``bytes(tag)`` cut or
            zero-padded to 16 bytes (the reference's rule).

    Returns:
        A ``BlobPlan``: ``nbytes`` (whole blob, bytes), ``entries``,
        ``index_bytes``, ``index_off``, ``keys``, ``tag``.

    Raises:
        FormatError: ``invalid_argument`` (keys and values differ in
            length; a tensor layout with no dense bytes such as sparse CSR;
            a structured dtype holding objects; a RawEntry whose data is not
            the length its dtype and shape need), ``unknown_dtype`` (a dtype
            the format has no size for; every numpy dtype but object is
            stored, ``longdouble`` included, and every torch 1.13 dtype,
            ``complex32`` and the quantized ones included: their
            integers), ``too_large`` (data or index reaching 4 GiB, which the
            v3 footer cannot address).
        Whatever pickling a value raises.
    """
    return BlobPlan._of(_blobpipe.plan(keys, values, tag))


def write(p: BlobPlan, out: _Any) -> None:
    """Writes the whole blob planned by ``p`` into ``out[0:p.nbytes]``.

    Entries, zero pads, index, footer: for the same keys, values and tag,
    the bytes the reference writes (with its pads zeroed). The GIL is
    released while the bytes are copied.

    Args:
        p: a plan from ``plan``, or one a caller built from the seven
            fields (written from ``entries``, ``buffers``, ``index_bytes``,
            ``nbytes`` and ``tag``, pads zeroed).
        out: a writable, C-contiguous buffer (bytearray, numpy array of any
            dtype, writable memoryview, mmap) of at least ``p.nbytes`` bytes.

    Raises:
        FormatError: ``buffer_too_small`` when ``out`` is shorter than
            ``p.nbytes``; ``invalid_argument`` when torch reallocated a
            planned tensor's bytes after ``plan`` (``resize_``): nothing of
            it is read; for a caller's plan, ``invalid_argument`` (a buffer
            that is not its entry's length, ``entries`` and ``buffers`` of
            different lengths, entries that overlap), ``entry_out_of_range``
            (an entry running into the index), ``too_large``; nothing is
            written then.
        BufferTypeError (a BufferError and a TypeError): ``out``, or a
            caller's plan's buffer, is read-only (``out``) or not
            C-contiguous; nothing is written then.
        TypeError: ``out`` has no buffer protocol, ``p`` is no plan, a
            caller's plan's entry offset or length is no integer or its tag
            is refused by ``bytes()`` (nothing is written then).
        ValueError: ``out`` is a released memoryview.
    """
    native = _native_of(p)
    if native is None:
        _write_fields(p, out)
    else:
        _blobpipe.write(native, out)


def write_tail(p: BlobPlan, out: _Any) -> None:
    """Writes only the index and the footer: ``len(p.index_bytes) +
    FOOTER_SIZE`` bytes into ``out``, which maps to blob offset
    ``p.index_off``. For a blob whose entries travel separately.

    Raises:
        FormatError: ``buffer_too_small`` when ``out`` is shorter than that.
        BufferTypeError, TypeError: as ``write``.
    """
    native = _native_of(p)
    if native is None:
        _write_tail_fields(p, out)
    else:
        _blobpipe.write_tail(native, out)


#: read_index(blob): the entries of a whole blob held in memory, in index
#: order, every row checked (the C++ function; its docstring says all).
read_index = _blobpipe.read_index


def read_index_file(f: _Any, off: int = 0, nbytes: int = 0) -> list[Entry]:
    """The entries of the blob stored at byte ``off`` of a file, ``nbytes``
    long (0: to the end of the file): two reads, the footer and then the
    index, never the entry bytes. Entry offsets are from the blob's start
    (add ``off`` for the file position).

    Args:
        f: a path (str, bytes, os.PathLike) of a regular file, or a file
            object opened in binary mode (``read(n)``, ``seek(pos, whence)``;
            its position is left after the index).
        off: where the blob starts in the file, bytes.
        nbytes: the blob's length in bytes, 0 for "to the end".

    Raises:
        FormatError: as ``read_index``; ``too_small`` when the file is shorter
            than ``off + nbytes``.
        FileError: the path cannot be opened or read, or is not a regular
            file (a FIFO, a directory); a file object's own exceptions
            propagate as they are.
        TypeError: ``f`` is neither a path nor an object with ``read`` and
            ``seek`` (``None``, say), or a file object opened in text mode;
            ``off`` or ``nbytes`` is no integer (``operator.index``).
        ValueError: ``off`` or ``nbytes`` is negative or not below 2**64.
    """
    return _blobpipe.read_index_file(f, _file_bytes(off, "off"), _file_bytes(nbytes, "nbytes"))


def _file_bytes(v: _Any, name: str) -> int:
    """read_index_file's ``off`` or ``nbytes``: an integer in [0, 2**64)."""
    n = _integer(v, f"read_index_file: {name}")
    if not 0 <= n < 2**64:
        raise ValueError(f"read_index_file: {name} must be within 0..2**64-1 bytes, not {n}")
    return n


#: decode_entry(view, e, *, allow_pickle=True): rebuilds an entry's value
#: from exactly its bytes, zero-copy (the C++ function; its docstring says all).
decode_entry = _blobpipe.decode_entry
#: decode_entries(blob, entries, *, allow_pickle=True): decode_entry of each
#: entry of a whole blob, as a list (one call for a whole index).
decode_entries = _blobpipe.decode_entries
#: materialize(v): a copy of a decoded value that no longer views the blob.
materialize = _blobpipe.materialize


def footer_is_valid(blob_tail: _Any) -> bool:
    """True when ``blob_tail`` (a buffer: the blob, or at least its last
    ``FOOTER_SIZE`` bytes) ends with a valid v3 or v2 footer.

    Raises:
        BufferTypeError (a BufferError and a TypeError): ``blob_tail`` is
            not C-contiguous.
        TypeError: ``blob_tail`` has no buffer protocol.
    """
    return _blobpipe.footer_is_valid(blob_tail)


def footer_tag(tail: _Any) -> _Optional[bytes]:
    """The 16-byte tag of the footer that ends ``tail``; ``None`` for an
    invalid footer, a v2 footer, or ``NO_TAG``.

    Raises:
        BufferTypeError, TypeError: as ``footer_is_valid``.
    """
    return _blobpipe.footer_tag(tail)
