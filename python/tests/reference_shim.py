"""Makes the reference codec importable where msgspec is missing (Debian 12
has none), for the tests and bench/python_bench.py only, never for the
package: ``msgspec.msgpack.encode/decode`` mapped onto Debian's
python3-msgpack, which writes the same bytes for the reference's index
(lists of str, int and None)."""

from __future__ import annotations

import importlib.util
import sys
import types


def shim_msgspec() -> None:
    """Installs the ``msgspec`` shim unless a real msgspec is importable.
    Raises ImportError when python3-msgpack is missing too."""
    if "msgspec" in sys.modules or importlib.util.find_spec("msgspec") is not None:
        return
    import msgpack

    shim = types.ModuleType("msgspec")
    shim.msgpack = types.ModuleType("msgspec.msgpack")
    shim.msgpack.encode = lambda obj: msgpack.packb(obj, use_bin_type=True)
    shim.msgpack.decode = lambda raw: msgpack.unpackb(raw, raw=False)
    sys.modules["msgspec"], sys.modules["msgspec.msgpack"] = shim, shim.msgpack
