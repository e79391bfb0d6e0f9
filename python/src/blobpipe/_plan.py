"""BlobPlan and the reference module's encode-side helpers.

The reference (``nemo_rl.data_plane.nixl.blob_format``) documents, besides
``plan``/``write``/``read_index``/``decode_entry``, the helpers its callers
use to lay a blob out themselves (NeMo RL's storage client sends large
values zero-copy from ``plan.buffers`` and packs the rest at ``_align_up``
offsets): ``_align_up``, ``_tensor_bytes``, ``_numpy_bytes``,
``encode_value``, ``_torch_dtype``, ``_footer``, ``_entries`` and the footer
formats ``_FOOTER_FMT``/``_FOOTER_V2_FMT``. They have the reference's
signatures, returns and built-in exceptions here; blobpipe's own additions
(``RawEntry`` values, quantized sub-byte tensors read without running past
their storage) are said where they apply.

``BlobPlan`` is a dataclass with the reference's fields in its order. A
plan made by ``plan()`` carries blobpipe's C++ layout and builds its Python
fields only when they are first read (``buffers`` and ``keepalive``
together); ``write``/``write_tail`` of such a plan never build them. A plan
built by a caller from the seven fields is written from those fields.
"""

from __future__ import annotations

import dataclasses
import operator
import pickle
import struct
import sys
from typing import Any, Optional

import numpy as np

from . import _blobpipe
from ._errors import BufferTypeError, FormatError
from ._raw import RawEntry

#: Entry alignment in bytes: every entry starts at a multiple of it.
ALIGN: int = _blobpipe.ALIGN
#: Footer magic, 0x4E564450 ("PDVN" on disk, little-endian).
MAGIC: int = _blobpipe.MAGIC
#: Version of the blob format written (3). Not the wire protocol's version.
VERSION: int = _blobpipe.VERSION
#: Size of the v3 footer in bytes (32): magic, version, flags, index_off,
#: index_len, 16-byte tag.
FOOTER_SIZE: int = _blobpipe.FOOTER_SIZE
#: Size of the legacy v2 footer in bytes (16, no tag); read, never written.
FOOTER_V2_SIZE: int = _blobpipe.FOOTER_V2_SIZE
#: The all-zero 16-byte tag: "no tag".
NO_TAG: bytes = _blobpipe.NO_TAG
#: Entry kinds: torch tensor, numpy array (C++: KIND_NDARRAY), pickle.
KIND_TENSOR: str = _blobpipe.KIND_TENSOR
KIND_NUMPY: str = _blobpipe.KIND_NUMPY
KIND_PICKLE: str = _blobpipe.KIND_PICKLE

#: struct format of the v3 footer (32 bytes, little-endian): magic (u32),
#: version (u16), flags (u16), index_off (u32, bytes from the blob's start),
#: index_len (u32, bytes), tag (16 bytes).
_FOOTER_FMT = "<IHHII16s"
#: struct format of the legacy v2 footer (16 bytes): the v3 fields less the tag.
_FOOTER_V2_FMT = "<IHHII"

# torch dtypes whose values are packed several to a byte, though torch
# reports an element size of 1.
_PACKED_QUANTIZED = ("quint4x2", "quint2x4")


def _align_up(n: int) -> int:
    """``n`` rounded up to the next multiple of ``ALIGN`` (64) bytes: where
    the entry after one ending at byte ``n`` starts."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _packed_quantized_bytes(t: Any) -> tuple[memoryview, Any]:
    # The packed bytes torch holds, then zeros up to numel bytes (the
    # length the reference records). The reference reads those bytes past
    # the end of the tensor's storage; blobpipe never does.
    out = np.zeros(t.numel(), dtype=np.uint8)
    packed = t.int_repr().reshape(-1).numpy()
    n = min(out.size, packed.size)
    out[:n] = packed[:n]
    return memoryview(out), out


def _tensor_bytes(t: Any) -> tuple[memoryview, Any]:
    """``(bytes, owner)`` of a torch tensor as a blob stores it: a 1-d
    ``memoryview`` (format ``B``) over its elements in C order, and the tensor
    that owns them. A CPU tensor that is already contiguous is viewed in
    place (the owner is ``t.detach()``, the same memory); a CUDA or
    non-contiguous one is copied first (the owner is the copy). An empty
    tensor gives ``memoryview(b"")``.

    Raises:
        RuntimeError: from torch, for tensors it cannot view as bytes
            (conjugate or negative views, sparse CSR), as the reference.
    """
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b""), t
    if str(t.dtype).removeprefix("torch.") in _PACKED_QUANTIZED:
        return _packed_quantized_bytes(t)
    flat = t.reshape(-1)
    as_bytes = flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)
    return memoryview(as_bytes.numpy()), t  # the numpy view holds the storage


def _numpy_bytes(a: np.ndarray) -> tuple[memoryview, Any]:
    """``(bytes, owner)`` of a numpy array as a blob stores it: a 1-d
    ``memoryview`` (format ``B``) over its elements in C order, and the
    C-contiguous array that owns them (``a`` itself when it already is one,
    else a copy; ``numpy.ascontiguousarray``, so a 0-d array becomes 1-d).

    Raises:
        TypeError: from numpy, for a dtype holding Python objects.
    """
    a = np.ascontiguousarray(a)
    return memoryview(a.view(np.uint8).reshape(-1)), a


def encode_value(key: str, v: Any) -> tuple[memoryview, Any, str, Optional[str],
                                             Optional[tuple[int, ...]]]:
    """``(bytes, owner, kind, dtype, shape)`` of one value, as ``plan`` stores
    it (``key`` is not used; the reference takes it too):

    - a torch tensor, neither nested nor sparse COO: ``_tensor_bytes(v)``,
      kind ``"t"``, dtype ``str(v.dtype)`` less ``"torch."``, shape in
      elements;
    - a numpy array without object dtype: ``_numpy_bytes(v)``, kind ``"n"``,
      dtype ``v.dtype.str``, shape in elements;
    - a ``RawEntry`` (blobpipe's; the reference pickles it): its bytes, kind,
      dtype and shape;
    - anything else: its pickle (``pickle.HIGHEST_PROTOCOL``) and that
      ``bytes`` object, kind ``"p"``, dtype and shape ``None``.

    Raises:
        RuntimeError, TypeError: as ``_tensor_bytes`` and ``_numpy_bytes``.
        Whatever pickling ``v`` raises.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor) and not v.is_nested \
            and not v.is_sparse:
        mv, owner = _tensor_bytes(v)
        return mv, owner, KIND_TENSOR, str(v.dtype).removeprefix("torch."), tuple(v.shape)
    if isinstance(v, np.ndarray) and v.dtype != object:
        mv, owner = _numpy_bytes(v)
        return mv, owner, KIND_NUMPY, v.dtype.str, tuple(v.shape)
    if type(v) is RawEntry:
        mv, owner = _numpy_bytes(v.data)
        return mv, owner, v.kind, v.dtype, tuple(v.shape)
    b = pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
    return memoryview(b), b, KIND_PICKLE, None, None


def _torch_dtype(name: str) -> Any:
    """The ``torch.dtype`` a kind ``"t"`` entry's dtype names: any name torch
    itself has for one (``"float32"``, ``"float"``, ``"chalf"``,
    ``"quint8"``...). Imports torch.

    Raises:
        FormatError (a ValueError): ``unknown_dtype`` when torch has no such
            dtype. TypeError when ``name`` is not a str (``getattr``'s).
    """
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise FormatError(f"unknown torch dtype {name!r}", "unknown_dtype")
    return dt


def _footer(blob: Any) -> Optional[tuple[int, int, bytes]]:
    """``(index_off, index_len, tag)`` of the footer that ends ``blob`` (any
    C-contiguous buffer): a v3 footer (magic, version 3) first, else a
    legacy v2 one (magic, version 2; tag ``NO_TAG``); ``None`` when neither
    is there. Offsets and lengths in bytes, as stored: not checked against
    the blob (``read_index`` checks them).

    Raises:
        TypeError: ``blob`` has no buffer protocol or is not C-contiguous.
    """
    b = memoryview(blob).cast("B")
    n = b.nbytes
    if n >= FOOTER_SIZE:
        magic, version, _flags, index_off, index_len, tag = struct.unpack_from(
            _FOOTER_FMT, b, n - FOOTER_SIZE)
        if magic == MAGIC and version == VERSION:
            return index_off, index_len, tag
    if n >= FOOTER_V2_SIZE:
        magic, version, _flags, index_off, index_len = struct.unpack_from(
            _FOOTER_V2_FMT, b, n - FOOTER_V2_SIZE)
        if magic == MAGIC and version == 2:
            return index_off, index_len, NO_TAG
    return None


def _entries(raw: Any) -> list:
    """The ``Entry`` rows of an index: ``raw`` is the index's msgpack bytes
    (``BlobPlan.index_bytes``, or ``blob[index_off:index_off + index_len]``),
    or the list of 6-element rows they decode to.

    From bytes, every row is checked as ``read_index`` checks it, except
    against a blob's size (there is none): known kind and dtype, shape x
    item size equal to the length, 64-byte aligned offsets.

    Raises:
        FormatError: ``malformed_index``, ``unknown_kind``, ``unknown_dtype``,
            ``shape_mismatch``, ``entry_out_of_range`` (from bytes).
        ValueError / TypeError: a decoded row that is not 6 fields, or a
            shape that is not a sequence (from a list, as the reference).
    """
    if isinstance(raw, (list, tuple)):
        return [_blobpipe.Entry(k, o, n, kind, d, None if s is None else tuple(s))
                for k, o, n, kind, d, s in raw]
    return _blobpipe._entries(raw)


_FIELDS = ("keys", "buffers", "keepalive", "entries", "index_bytes", "nbytes", "tag")


@dataclasses.dataclass(repr=False)
class BlobPlan:
    """A blob's layout, as the reference's ``BlobPlan`` (a dataclass with its
    fields in its order): ``plan()`` makes one, ``write()`` fills a buffer
    from it, ``write_tail()`` writes its index and footer.

    Attributes:
        keys: the keys, ``str(key)`` each (list of str).
        buffers: each value's bytes in C order, a 1-d ``memoryview`` (format
            ``B``, ``e.len`` bytes): a view of the caller's own memory for a
            C-contiguous CPU tensor or array, else a view of a copy (CUDA,
            non-contiguous) or of the pickle; writable where the value is.
        keepalive: the owners of ``buffers`` (the detached tensor, the
            contiguous array, the pickle's bytes), one per value.
        entries: the index rows (list of ``Entry``).
        index_bytes: the msgpack index (bytes).
        nbytes: size of the whole blob, bytes.
        tag: the 16-byte tag.
        index_off: (property) offset of the index from the blob's start,
            ``nbytes - FOOTER_SIZE - len(index_bytes)`` bytes.

    A plan from ``plan()`` builds ``keys``, ``entries`` and ``index_bytes``
    when first read and ``buffers``/``keepalive`` together when either is
    (the values' ``_tensor_bytes``/``_numpy_bytes``): ``plan`` + ``write``
    never pay for them. It keeps the planned values alive until dropped.
    Assigning a field turns it into a caller's plan, written from its
    fields. A caller's plan (``BlobPlan(keys, buffers, keepalive, entries,
    index_bytes, nbytes, tag)``) is written as the reference writes one:
    ``buffers[i]`` at ``entries[i].off``, the index at ``index_off``, the
    footer last; blobpipe also zeroes the pads between entries, and refuses
    (FormatError, ``invalid_argument``) a plan whose ``entries`` and
    ``buffers`` differ in length or whose entries overlap, where the
    reference would write a blob that does not hold what its index says.

    Source: BlobPlan (Python reference); blobpipe/format/layout.hpp.
    """

    keys: list
    buffers: list
    keepalive: list
    entries: list
    index_bytes: bytes
    nbytes: int
    tag: bytes = NO_TAG

    @classmethod
    def _of(cls, native: Any) -> "BlobPlan":
        # Fields are filled in on first read (__getattr__); the instance's
        # __dict__ is written directly so no field counts as assigned.
        p = object.__new__(cls)
        d = p.__dict__
        d["_native"] = native
        d["nbytes"] = native.nbytes
        d["tag"] = native.tag
        return p

    def __getattr__(self, name: str) -> Any:
        # Only reached for a field not built yet (or a missing attribute).
        native = self.__dict__.get("_native")
        if native is None or name not in _FIELDS:
            raise AttributeError(f"'BlobPlan' object has no attribute {name!r}")
        d = self.__dict__
        if name in ("buffers", "keepalive"):
            # Made natively where the value's bytes are used in place;
            # here (as the reference makes them) where they are copied: a
            # numpy array, or a tensor (CUDA, non-contiguous, empty).
            buffers, owners, missing = native._buffers()
            for i in missing:
                owner = owners[i]
                bytes_of = _numpy_bytes if isinstance(owner, np.ndarray) else _tensor_bytes
                buffers[i], owners[i] = bytes_of(owner)
            d["buffers"], d["keepalive"] = buffers, owners
        else:
            d[name] = getattr(native, name)
        return d[name]

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if name in _FIELDS and "_native" in d:
            for f in _FIELDS:  # the other fields as planned, then no native plan
                getattr(self, f)
            # The native plan stays alive, unused: its weak references to
            # the numpy arrays that ``buffers`` view make numpy refuse to
            # resize them (even with refcheck=False) while this plan lives.
            d["_pins"] = d.pop("_native")
        object.__setattr__(self, name, value)

    @property
    def index_off(self) -> int:
        native = self.__dict__.get("_native")
        if native is not None:
            return native.index_off
        return self.nbytes - FOOTER_SIZE - len(self.index_bytes)

    def __len__(self) -> int:
        """The number of entries."""
        native = self.__dict__.get("_native")
        return len(native) if native is not None else len(self.entries)

    def __repr__(self) -> str:
        return (f"BlobPlan({len(self)} entries, nbytes={self.nbytes}, "
                f"tag={bytes(self.tag).hex()})")


class _Planned:
    """A field of a plan from ``plan()``, built on first read by
    ``BlobPlan.__getattr__``. A non-data descriptor: once the field is built
    or assigned, the instance's ``__dict__`` answers without it; and a
    first read comes here rather than through a failed attribute lookup
    (an AttributeError made and caught per read of ``entries`` or
    ``buffers``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:  # BlobPlan.entries: no class attribute, as for the dataclass
            raise AttributeError(f"type object 'BlobPlan' has no attribute {self.name!r}")
        return obj.__getattr__(self.name)


for _name in ("keys", "buffers", "keepalive", "entries", "index_bytes"):
    setattr(BlobPlan, _name, _Planned(_name))
del _name


def _native_of(p: Any) -> Any:
    return p.__dict__.get("_native") if type(p) is BlobPlan else None


def _out_bytes(out: Any) -> memoryview:
    mv = memoryview(out)  # TypeError without the buffer protocol
    if mv.readonly:
        raise BufferTypeError("write: out is read-only")
    if not mv.c_contiguous:
        raise BufferTypeError("write: out is not C-contiguous")
    return mv.cast("B")


def _fields_of(p: Any) -> tuple:
    try:
        index, nbytes, tag = p.index_bytes, p.nbytes, p.tag
    except AttributeError:
        raise TypeError(f"expected a BlobPlan, not {type(p).__name__}") from None
    return index, _integer(nbytes, "the plan's nbytes"), tag


def _integer(v: Any, what: str) -> int:
    """operator.index(v), its TypeError naming what v is; a bool (Python's
    or numpy's) is no integer here."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer, not {type(v).__name__}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(v).__name__}") from None


def _footer_bytes(index: bytes, index_off: int, nbytes: int, tag: Any) -> bytes:
    """The v3 footer of a caller's plan, checked before any byte is written."""
    if not 0 <= index_off < 2**32 or len(index) >= 2**32:
        raise FormatError(f"index at {index_off} (+{len(index)} bytes) of a {nbytes}-byte blob "
                          "cannot be addressed by the v3 footer", "too_large")
    return struct.pack(_FOOTER_FMT, MAGIC, VERSION, 0, index_off, len(index),
                       _blobpipe._tag_bytes(tag))


def _write_footer(o: memoryview, at: int, index: bytes, footer: bytes) -> None:
    o[at:at + len(index)] = index
    o[at + len(index):at + len(index) + len(footer)] = footer


def _check_ranges(entries: list, index_off: int) -> None:
    """A caller's plan's entries lie before its index and apart (the
    reference writes an overlapping one over another: a blob that does not
    hold what its index says), else FormatError."""
    # An entry that is no Entry, an offset or length that is no integer, is
    # refused (TypeError) here, before anything is written.
    spans = []
    for i, e in enumerate(entries):
        if not isinstance(e, _blobpipe.Entry):
            raise TypeError(f"the plan's entries[{i}] must be an Entry, not {type(e).__name__}")
        off = _integer(e.off, f"entry {e.key!r}'s off")
        n = _integer(e.len, f"entry {e.key!r}'s len")
        if n:
            spans.append((off, off + n, e.key))
    spans.sort(key=lambda s: s[0])
    end, last = 0, None
    for off, stop, key in spans:
        if off < 0 or stop > index_off:
            raise FormatError(f"entry {key!r} [{off}, +{stop - off}) runs into the index at "
                              f"{index_off}", "entry_out_of_range")
        if off < end:
            raise FormatError(f"entries {last!r} and {key!r} overlap at byte {off}",
                              "invalid_argument")
        end, last = stop, key


def _write_fields(p: Any, out: Any) -> None:
    """write() of a caller's plan: from its fields."""
    index, nbytes, tag = _fields_of(p)
    index = bytes(memoryview(index))  # a buffer: bytes(n) would allocate n
    o = _out_bytes(out)
    if o.nbytes < nbytes:
        raise FormatError(f"buffer has {o.nbytes} bytes, the blob needs {nbytes}",
                          "buffer_too_small")
    index_off = nbytes - FOOTER_SIZE - len(index)
    footer = _footer_bytes(index, index_off, nbytes, tag)
    entries, buffers = p.entries, p.buffers
    if len(entries) != len(buffers):
        raise FormatError(f"the plan has {len(entries)} entries and {len(buffers)} buffers",
                          "invalid_argument")
    _check_ranges(entries, index_off)
    sources = []
    for e, b in zip(entries, buffers):
        if not e.len:
            continue
        mv = memoryview(b)
        if not mv.c_contiguous:
            raise BufferTypeError(f"entry {e.key!r}: its buffer is not C-contiguous")
        src = mv.cast("B")
        if src.nbytes != e.len:
            raise FormatError(f"entry {e.key!r}: its buffer has {src.nbytes} bytes, the entry "
                              f"{e.len}", "invalid_argument")
        sources.append((e, src))
    cur = 0
    for e, src in sources:
        if e.off > cur:
            o[cur:e.off] = bytes(e.off - cur)  # pads zeroed, as write() of a plan() does
        o[e.off:e.off + e.len] = src
        cur = max(cur, e.off + e.len)
    if index_off > cur:
        o[cur:index_off] = bytes(index_off - cur)
    _write_footer(o, index_off, index, footer)


def _write_tail_fields(p: Any, out: Any) -> None:
    """write_tail() of a caller's plan: from its fields."""
    index, nbytes, tag = _fields_of(p)
    index = bytes(memoryview(index))  # a buffer: bytes(n) would allocate n
    o = _out_bytes(out)
    need = len(index) + FOOTER_SIZE
    if o.nbytes < need:
        raise FormatError(f"buffer has {o.nbytes} bytes, index and footer need {need}",
                          "buffer_too_small")
    footer = _footer_bytes(index, nbytes - FOOTER_SIZE - len(index), nbytes, tag)
    _write_footer(o, 0, index, footer)
