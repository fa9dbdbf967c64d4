"""Reading gzip'd trace text: isal's igzip where it is installed (``pip install 'otel-gpu[trace]'``;
it inflates 2-3x faster than zlib: ~1 ms instead of ~3 ms for a 180 KB file of 1.7 MB), else the
standard library's gzip. Both read the same text from a valid file and raise on a damaged one
(truncated, a bad CRC, not gzip) with one of ``READ_ERRORS``; OTELGPU_TRACE_GZIP=zlib forces the
standard library.
"""
from __future__ import annotations

import gzip
import os
import zlib
from typing import BinaryIO, TextIO

_igzip = None
_isal_error: tuple = ()
if os.environ.get("OTELGPU_TRACE_GZIP", "").lower() != "zlib":
    try:
        from isal import igzip as _igzip, isal_zlib as _isal_zlib
    except ImportError:  # pragma: no cover - depends on the environment (_igzip stays None)
        pass
    else:
        _isal_error = (_isal_zlib.error,)

GZIP_BACKEND = "isal" if _igzip is not None else "zlib"
# what reading a damaged gzip file raises (BadGzipFile is an OSError)
READ_ERRORS = (EOFError, OSError, zlib.error, UnicodeDecodeError, *_isal_error)


def backends() -> list[str]:
    """The gzip readers this process has: "zlib", and "isal" where it is installed."""
    return ["zlib"] + (["isal"] if _igzip is not None else [])


def open_text(raw: BinaryIO, backend: str = GZIP_BACKEND) -> TextIO:
    """Text (UTF-8, a leading BOM dropped) of the gzip'd binary file ``raw``, read as it is decoded."""
    opener = _igzip.open if backend == "isal" and _igzip is not None else gzip.open
    return opener(raw, "rt", encoding="utf-8-sig")
