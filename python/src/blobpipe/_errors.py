"""blobpipe's exceptions.

Every failure blobpipe reports carries the C++ library's error category
(``blobpipe::errc``, as ``errc_name`` spells it, and as the CLI prints it in
``blobpipe: CATEGORY: message``) in ``.category``, and a one-line message in
``str(e)``. The class says which family the category belongs to, so that
code written against the reference codec, which raises ``ValueError`` for a
bad blob, keeps working: ``FormatError`` is a ``ValueError``.
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


class FileError(Error, OSError):
    """A file that cannot be opened, seeked or read, or is not a regular file
    (``read_index_file``). ``.category`` is ``"io"``."""


def error_for(category: str, message: str) -> Error:
    """The exception for a blobpipe error: used by the extension module."""
    if category in FORMAT_CATEGORIES:
        return FormatError(message, category)
    if category == "io":
        return FileError(message, category)
    return Error(message, category)
