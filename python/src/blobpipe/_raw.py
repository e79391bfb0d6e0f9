"""RawEntry: an entry whose dtype neither torch nor numpy has here."""

from __future__ import annotations

from typing import Tuple

import numpy as np


class RawEntry:
    """The bytes of a kind ``t`` (or ``n``) entry that no library at hand can
    type: ``bfloat16`` without torch (numpy has no bfloat16), the
    ``float8_*`` formats without a torch that has them (Debian's torch 1.13
    has none), or a numpy ``dtype.str`` this numpy cannot build.
    ``decode_entry`` returns one instead of failing or guessing a dtype, and
    ``plan`` and ``Blob.emit`` store one as the entry it came from (same
    kind, dtype, shape and bytes).

    ``RawEntry("p", "", (), data)`` stores ``data``, bytes that already are
    a pickle, as a kind ``p`` entry unchanged (not pickled again): for
    pickles whose exact bytes matter to the peer (see
    ``examples/python/rollout_to_trainer.py``).

    Attributes:
        kind: the entry's kind, ``"t"`` or ``"n"`` (or ``"p"``, above).
        dtype: the entry's dtype name as blobpipe reads it (torch's canonical
            spelling, e.g. ``"bfloat16"``, or the numpy ``dtype.str``).
        shape: the shape in elements.
        data: the entry's bytes as a 1-d ``numpy.uint8`` array of
            ``prod(shape) * itemsize`` elements, a zero-copy view of the
            buffer given to ``decode_entry`` (``materialize`` copies it).
    """

    __slots__ = ("kind", "dtype", "shape", "data")

    def __init__(self, kind: str, dtype: str, shape: Tuple[int, ...], data: np.ndarray) -> None:
        self.kind = kind
        self.dtype = dtype
        self.shape = tuple(shape)
        self.data = data

    @property
    def nbytes(self) -> int:
        """Length of the entry in bytes."""
        return int(self.data.nbytes)

    def tobytes(self) -> bytes:
        """A copy of the entry's bytes."""
        return self.data.tobytes()

    def copy(self) -> "RawEntry":
        """The same entry over a copy of its bytes."""
        return RawEntry(self.kind, self.dtype, self.shape, self.data.copy())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RawEntry):
            return NotImplemented
        return (self.kind, self.dtype, self.shape) == (other.kind, other.dtype, other.shape) \
            and bool(np.array_equal(self.data, other.data))

    __hash__ = None  # type: ignore[assignment]  # mutable bytes, like ndarray

    def __repr__(self) -> str:
        return (f"RawEntry(kind={self.kind!r}, dtype={self.dtype!r}, shape={self.shape!r}, "
                f"nbytes={self.nbytes})")
