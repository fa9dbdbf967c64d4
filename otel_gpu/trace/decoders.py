"""The JSON decoders that feed :class:`.intake.Collector`: msgspec structs when installed, else
orjson's or the standard library's dicts (identical results). Imported where a trace is read, not
with the analyses: a process that only combines the ranks' results (set_workers) never loads the
decoders (msgspec and orjson: about 2 MB of resident memory).
"""
from __future__ import annotations

import json
import os
import re

from .intake import BW_ARG, Collector

# optional fast decoders (pip install 'otel-gpu[trace]'): msgspec decodes only the fields kept,
# straight into small structs; orjson decodes whole events. OTELGPU_TRACE_JSON=json forces the
# standard library, =orjson skips msgspec. Results are identical whichever decodes.
_choice = os.environ.get("OTELGPU_TRACE_JSON", "").lower()
_fast_json = None
_msgspec = None
if _choice != "json":
    try:
        import orjson as _fast_json
    except ImportError:  # pragma: no cover - depends on the environment
        _fast_json = None
    if _choice != "orjson":
        try:
            import msgspec as _msgspec
        except ImportError:  # pragma: no cover - depends on the environment
            _msgspec = None


_loads = _fast_json.loads if _fast_json is not None else json.loads
JSON_BACKEND = "msgspec" if _msgspec is not None else "orjson" if _fast_json is not None else "json"
_decode_structs = None
SHAPE_TRACE = None   # a trace file's operator shapes (:mod:`.op_shapes`), where msgspec decodes
if _msgspec is not None:
    from typing import Any

    # gc=False: the structs are not tracked by the cyclic garbage collector (decoded JSON holds no
    # cycles), so decoding ~100,000s of events does not set off collections that walk the heap
    class _Args(_msgspec.Struct, gc=False):
        """The ``args`` fields kept; any JSON type is accepted here and checked in ``put``."""

        stream: Any = -1
        correlation: Any = -1
        external_id: Any = _msgspec.field(name="External id", default=None)
        external_id_legacy: Any = _msgspec.field(name="external id", default=None)
        bw: Any = _msgspec.field(name=BW_ARG, default=0.0)
        wait_on_stream: Any = -1
        wait_on_event: Any = _msgspec.field(name="wait_on_cuda_event_record_corr_id", default=-1)

    class _Event(_msgspec.Struct, gc=False):
        """The event fields kept; other keys are skipped by the decoder without being built."""

        ts: Any = None
        dur: Any = None
        cat: Any = None
        name: Any = None
        pid: Any = None
        tid: Any = None
        args: _Args | None = None

    class _TypedArgs(_msgspec.Struct, gc=False):
        """``args`` as well-formed traces have them (the decoder refuses anything else)."""

        stream: int = -1
        correlation: int = -1
        external_id: int | None = _msgspec.field(name="External id", default=None)
        external_id_legacy: int | None = _msgspec.field(name="external id", default=None)
        bw: float = _msgspec.field(name=BW_ARG, default=0.0)
        wait_on_stream: int = -1
        wait_on_event: int = _msgspec.field(name="wait_on_cuda_event_record_corr_id", default=-1)

    class _TypedEvent(_msgspec.Struct, gc=False):
        """An event as well-formed traces have it (numbers where numbers belong)."""

        ts: int | float | None = None
        dur: int | float | None = None
        cat: str | None = None
        name: str | None = None
        pid: int | str | None = None
        tid: int | str | None = None
        args: _TypedArgs | None = None

    class _ShapeArgs(_msgspec.Struct):
        ext: object = _msgspec.field(name="External id", default=None)
        dims: _msgspec.Raw = _msgspec.field(name="Input Dims", default=_msgspec.Raw(b"null"))
        types: _msgspec.Raw = _msgspec.field(name="Input type", default=_msgspec.Raw(b"null"))

    class _ShapeEvent(_msgspec.Struct):
        cat: object = None
        name: object = None
        args: _ShapeArgs | None = None

    class _ShapeTrace(_msgspec.Struct):
        traceEvents: list[_ShapeEvent] = []

    SHAPE_TRACE = _ShapeTrace

    NO_ARGS = _TypedArgs()   # an event without args: no stream, correlation, id or bandwidth
    _decode_structs = _msgspec.json.Decoder(list[_Event]).decode
    _decode_typed = _msgspec.json.Decoder(list[_TypedEvent]).decode


_MALFORMED_AT = re.compile(r"JSON is malformed: .* \(byte (\d+)\)")


def _ends_inside_a_value(piece: str, exc: Exception) -> bool:
    """The decoder's error says the piece is well-formed up to its end and ends inside a value (a
    batch cut inside an event's nested object: its closing ``]`` comes too early, or the text stops).
    No decoder takes such a piece (the standard library's accepts more, NaN literals, but not an
    unclosed value), so the caller's earlier cut is tried at once. False when unsure."""
    msg = str(exc)
    if msg == "Input data was truncated":
        return True
    m = _MALFORMED_AT.fullmatch(msg)
    return m is not None and piece.isascii() and int(m.group(1)) >= len(piece) - 1


def decode_piece(piece: str, col: Collector) -> bool:
    """Decode a JSON array of events and feed the collector; False when it is not valid JSON, or
    nested too deeply for the decoders (which recurse: thousands of levels in ``args``); the caller
    then decodes event by event, where the bad one is named.

    Fastest first: well-typed events in one vectorized intake, then any-typed structs event by
    event, then whole dicts (orjson or the standard library). Each path applies the same rules."""
    try:
        return _decode_piece(piece, col)
    except RecursionError:   # raised by a decoder, before any event of the piece is taken
        return False


def _decode_piece(piece: str, col: Collector) -> bool:
    if _decode_structs is not None:
        try:
            if col.add_typed(_decode_typed(piece), NO_ARGS):
                return True
        except _msgspec.DecodeError as exc:  # a field of an unexpected type (or invalid JSON)
            if _ends_inside_a_value(piece, exc):
                return False   # what every decoder refuses: not decoded three more times
        try:
            events = _decode_structs(piece)
        except _msgspec.DecodeError:  # invalid JSON, or an element msgspec cannot type (args not an object...)
            pass
        else:
            add = col.add_struct
            for e in events:
                add(e)
            return True
    try:
        events = _loads(piece)
    except ValueError:  # JSONDecodeError of either decoder; NaN literals: stdlib only
        try:
            events = json.loads(piece) if _fast_json is not None else None
        except ValueError:
            events = None
        if events is None:
            return False
    add = col.add
    for e in events:
        add(e)
    return True
