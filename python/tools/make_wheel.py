"""Builds blobpipe's wheel from the files of //python:blobpipe (a Bazel
genrule runs it with /usr/bin/python3, the interpreter the extension is
built for):

    make_wheel.py --version VERSION --out blobpipe-VERSION-cp311-cp311-linux_x86_64.whl FILE...

Each FILE goes into the wheel as blobpipe/<its name>; the dist-info
(METADATA, WHEEL, RECORD) follows PEP 427/491. The zip is reproducible:
fixed timestamps and modes, files in name order. numpy is the one
requirement; torch is optional (the extra "torch").
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
import sysconfig
import zipfile
from pathlib import Path

SUMMARY = "NVDP blobs from Python: blobpipe's C++ codec with the reference codec's API"


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args()

    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    tag = f"{py}-{py}-{platform}"
    expected = f"blobpipe-{args.version}-{tag}.whl"
    if args.out.name != expected:
        sys.exit(f"make_wheel: this interpreter makes {expected}, not {args.out.name}")

    dist_info = f"blobpipe-{args.version}.dist-info"
    entries = [(f"blobpipe/{f.name}", f.read_bytes(), 0o755 if f.suffix == ".so" else 0o644)
               for f in sorted(args.files, key=lambda f: f.name)]
    metadata = "".join([
        "Metadata-Version: 2.1\n",
        "Name: blobpipe\n",
        f"Version: {args.version}\n",
        f"Summary: {SUMMARY}\n",
        f"Requires-Python: =={sys.version_info.major}.{sys.version_info.minor}.*\n",
        "Requires-Dist: numpy\n",
        "Provides-Extra: torch\n",
        'Requires-Dist: torch; extra == "torch"\n',
    ])
    wheel = f"Wheel-Version: 1.0\nGenerator: blobpipe make_wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n"
    entries += [(f"{dist_info}/METADATA", metadata.encode(), 0o644),
                (f"{dist_info}/WHEEL", wheel.encode(), 0o644)]
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data, _ in entries)
    record += f"{dist_info}/RECORD,,\n"
    entries.append((f"{dist_info}/RECORD", record.encode(), 0o644))

    with zipfile.ZipFile(args.out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
