"""Reading gzip'd trace text: isal's igzip where it is installed (``pip install 'otel-gpu[trace]'``;
it inflates 2-3x faster than zlib: ~1 ms instead of ~3 ms for a 180 KB file of 1.7 MB), else the
standard library's gzip. Both read the same text from a valid file and raise on a damaged one
(truncated, a bad CRC, not gzip) with one of ``READ_ERRORS``; OTELGPU_TRACE_GZIP=zlib forces the
standard library. isal is imported by the first read (``open_text``), not with this module: a
process that reads no trace (the one combining the ranks' results) does not load it.
"""
from __future__ import annotations

import gzip
import os
import zlib
from importlib.util import find_spec
from typing import BinaryIO, TextIO

_WANTED = os.environ.get("OTELGPU_TRACE_GZIP", "").lower() != "zlib"
GZIP_BACKEND = "isal" if _WANTED and find_spec("isal") is not None else "zlib"
# what reading a damaged gzip file raises (BadGzipFile is an OSError); isal's error is added when
# isal is loaded: read it as ``gz.READ_ERRORS`` at the time of the error
READ_ERRORS: tuple = (EOFError, OSError, zlib.error, UnicodeDecodeError)
_igzip = None


def _load_isal():
    """isal's igzip module (imported once), or None where it cannot be."""
    global _igzip, READ_ERRORS
    if _igzip is None and GZIP_BACKEND == "isal":
        try:
            from isal import igzip, isal_zlib
        except ImportError:  # pragma: no cover - a broken install: zlib reads instead
            return None
        READ_ERRORS = (*READ_ERRORS, isal_zlib.error)
        _igzip = igzip
    return _igzip


def backends() -> list[str]:
    """The gzip readers this process has: "zlib", and "isal" where it is installed (loaded here)."""
    return ["zlib"] + (["isal"] if _load_isal() is not None else [])


def open_text(raw: BinaryIO, backend: str = GZIP_BACKEND) -> TextIO:
    """Text (UTF-8, a leading BOM dropped) of the gzip'd binary file ``raw``, read as it is decoded."""
    igzip = _load_isal() if backend == "isal" else None
    opener = igzip.open if igzip is not None else gzip.open
    return opener(raw, "rt", encoding="utf-8-sig")
