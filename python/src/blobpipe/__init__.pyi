"""Type stubs of the package ``blobpipe``: every public name (``__all__``),
the reference module's helpers that its callers use, and ``__version__``.
The extension's classes are typed in ``_blobpipe.pyi``. Sizes and offsets
are in bytes (offsets from the blob's start), shapes in elements,
timeouts in seconds; errors and sources: the docstrings at run time."""

from typing import Any, Optional, Sequence, Tuple

import numpy as np
from _typeshed import ReadableBuffer, WriteableBuffer

from ._blobpipe import Blob as Blob
from ._blobpipe import BlobAborted as BlobAborted
from ._blobpipe import BlobComplete as BlobComplete
from ._blobpipe import Consumer as Consumer
from ._blobpipe import Entry as Entry
from ._blobpipe import EntryReady as EntryReady
from ._blobpipe import Listener as Listener
from ._blobpipe import ReceivedBuffer as ReceivedBuffer
from ._blobpipe import Sender as Sender
from ._errors import AbortedError as AbortedError
from ._errors import ClosedError as ClosedError
from ._errors import Error as Error
from ._errors import FileError as FileError
from ._errors import ForkedError as ForkedError
from ._errors import FormatError as FormatError
from ._errors import ListenError as ListenError
from ._errors import PeerClosedError as PeerClosedError
from ._errors import PeerFailedError as PeerFailedError
from ._errors import ProtocolViolationError as ProtocolViolationError
from ._errors import StreamError as StreamError
from ._errors import TimedOutError as TimedOutError
from ._errors import URLError as URLError
from ._plan import BlobPlan as BlobPlan
from ._raw import RawEntry as RawEntry

__version__: str

ALIGN: int
MAGIC: int
VERSION: int
FOOTER_SIZE: int
FOOTER_V2_SIZE: int
NO_TAG: bytes
KIND_TENSOR: str
KIND_NUMPY: str
KIND_PICKLE: str
_FOOTER_FMT: str
_FOOTER_V2_FMT: str

# The codec (the reference's names).
def plan(keys: Sequence[Any], values: Sequence[Any], tag: ReadableBuffer = ...) -> BlobPlan: ...
def write(p: BlobPlan, out: WriteableBuffer) -> None: ...
def write_tail(p: BlobPlan, out: WriteableBuffer) -> None: ...
def read_index(blob: ReadableBuffer) -> list[Entry]: ...
def read_index_file(f: Any, off: int = 0, nbytes: int = 0) -> list[Entry]: ...
def decode_entry(view: ReadableBuffer, e: Entry, *, allow_pickle: bool = True) -> Any: ...
def decode_entries(blob: ReadableBuffer, entries: Sequence[Entry], *,
                   allow_pickle: bool = True) -> list[Any]: ...
def materialize(v: Any) -> Any: ...
def footer_is_valid(blob_tail: ReadableBuffer) -> bool: ...
def footer_tag(tail: ReadableBuffer) -> Optional[bytes]: ...
def encode_value(key: str, v: Any) -> Tuple[memoryview, Any, str, Optional[str],
                                            Optional[Tuple[int, ...]]]: ...

# The reference's helpers.
def _align_up(n: int) -> int: ...
def _tensor_bytes(t: Any) -> Tuple[memoryview, Any]: ...
def _numpy_bytes(a: np.ndarray) -> Tuple[memoryview, Any]: ...
def _torch_dtype(name: str) -> Any: ...
def _footer(blob: ReadableBuffer) -> Optional[Tuple[int, int, bytes]]: ...
def _entries(raw: Any) -> list[Entry]: ...

# Streaming.
def connect(url: str, **options: Any) -> Sender: ...
def listen(url: str, **options: Any) -> Listener: ...
def loopback_pair(*, sender_options: Optional[dict[str, Any]] = None,
                  consumer_options: Optional[dict[str, Any]] = None) -> Tuple[Sender, Consumer]: ...
def parse_url(url: str, *, listening: bool = False) -> Tuple[str, str, int]: ...
