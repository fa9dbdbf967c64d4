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

try:
    import msgspec as _msgspec
except ImportError:  # optional: the standard library decodes the same fields
    _msgspec = None

MAX_BYTES = 1 << 30  # larger files on disk are not read again for shapes


def _open(path: str) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(2)
        fh.seek(0)
        return gzip.decompress(fh.read()) if head == b"\x1f\x8b" else fh.read()


if _msgspec is not None:
    class _Args(_msgspec.Struct):
        ext: object = _msgspec.field(name="External id", default=None)
        dims: _msgspec.Raw = _msgspec.field(name="Input Dims", default=_msgspec.Raw(b"null"))
        types: _msgspec.Raw = _msgspec.field(name="Input type", default=_msgspec.Raw(b"null"))

    class _Event(_msgspec.Struct):
        cat: object = None
        name: object = None
        args: _Args | None = None

    class _Trace(_msgspec.Struct):
        traceEvents: list[_Event] = []


def _events_msgspec(data: bytes):
    for e in _msgspec.json.decode(data, type=_Trace).traceEvents:
        a = e.args
        if a is not None and a.ext is not None and bytes(a.dims) != b"null":
            yield e.cat, e.name, a.ext, lambda a=a: (_msgspec.json.decode(a.dims), _msgspec.json.decode(a.types))


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
    except (OSError, EOFError) as exc:
        return {}, f"shapes not read: {exc}"
    out: dict[int, dict] = {}
    try:
        events = _events_msgspec(data) if _msgspec is not None else _events_json(data)
        for cat, name, ext, args in events:
            if cat == "cpu_op" and ext in external_ids and ext not in out:
                dims, types = args()
                out[ext] = {"op": str(name), "dims": dims, "types": types}
    except (ValueError, TypeError) as exc:  # msgspec.DecodeError is a ValueError
        return out, f"shapes not read: {exc}"
    return out, None
