"""Input shapes of a few CPU operators, read back from a trace recorded with ``record_shapes=True``.

The reader keeps no operator arguments (memory per event); when a finding wants to name the
shapes behind its kernels, this reads the file once more for the operators with the given
external ids only (``args["Input Dims"]``, ``args["Input type"]``). Done for one rank per
finding, and only when a finding asks.
"""
from __future__ import annotations

import gzip
import json
import os
import zlib

MAX_BYTES = 1 << 30  # larger files on disk are not read again for shapes


def _open(path: str) -> bytes:
    """The file's text as bytes (inflated where gzip'd), at most ``MAX_BYTES`` of it: a longer
    text raises ValueError (a small file can inflate to any size)."""
    with open(path, "rb") as fh:
        head = fh.read(2)
        fh.seek(0)
        src = gzip.GzipFile(fileobj=fh) if head == b"\x1f\x8b" else fh
        data = src.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{os.path.basename(path)} holds over {MAX_BYTES >> 20} MB of text")
    return data


def _events_msgspec(data: bytes):
    from .decoders import SHAPE_TRACE, _msgspec   # (loaded by the first read: see decoders)

    decode = _msgspec.json.decode
    for e in decode(data, type=SHAPE_TRACE).traceEvents:
        a = e.args
        if a is not None and a.ext is not None and bytes(a.dims) != b"null":
            yield e.cat, e.name, a.ext, lambda a=a: (decode(a.dims), decode(a.types))


def _events_json(data: bytes):
    doc = json.loads(data)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    for e in events if isinstance(events, list) else []:
        a = e.get("args") if isinstance(e, dict) else None
        if isinstance(a, dict) and a.get("External id") is not None and "Input Dims" in a:
            yield e.get("cat"), e.get("name"), a.get("External id"), lambda a=a: (a["Input Dims"], a.get("Input type"))


def input_shapes(path: str, external_ids: set[int]) -> tuple[dict[int, dict], str | None]:
    """({external id: {"op", "dims", "types"}} for the CPU operators (``cpu_op``) with those ids,
    why none were read or None). Nothing when the file has no shapes."""
    if not external_ids:
        return {}, None
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return {}, f"shapes not read: {os.path.basename(path)} is over {MAX_BYTES >> 20} MB"
        data = _open(path)
    except (OSError, EOFError, ValueError, zlib.error) as exc:   # (BadGzipFile is an OSError)
        return {}, f"shapes not read: {exc}"
    out: dict[int, dict] = {}
    try:
        from .decoders import SHAPE_TRACE

        events = _events_msgspec(data) if SHAPE_TRACE is not None else _events_json(data)
        for cat, name, ext, args in events:
            if cat == "cpu_op" and ext in external_ids and ext not in out:
                dims, types = args()
                out[ext] = {"op": str(name), "dims": dims, "types": types}
    except (ValueError, TypeError) as exc:  # msgspec.DecodeError is a ValueError
        return out, f"shapes not read: {exc}"
    return out, None
