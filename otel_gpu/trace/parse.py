"""Streaming reader for PyTorch profiler (Kineto) Chrome-trace JSON files.

The file is never loaded whole: text is decoded in chunks (gzip streamed too) and each
element of ``traceEvents`` is decoded on its own, then reduced to a few numbers kept in
compact numpy arrays (:class:`RankEvents`). Times are microseconds (us).
"""
from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from array import array
from dataclasses import dataclass, field

import numpy as np

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

CHUNK_CHARS = 1 << 22  # 4 Mi characters of text per read
_WS = " \t\r\n"
_NUMBER_TAIL = frozenset("0123456789.eE+-")
_RANK_RE = re.compile(r'"rank":[^\S\n]+(\d+)')  # HTA's rank detection: first match, one line
MAX_RANK = 1 << 24
TIME_LIMIT_US = float(1 << 53)  # |ts| and dur beyond this (about 285 years) cannot be a profiler time
_I64 = 1 << 63
_MAX_INT_DIGITS = 40


def _bounded_int(text: str):
    """JSON integer literal -> int; longer than any int64 -> +-inf (then refused as out of range),
    instead of Python's error on integers of more than 4300 digits."""
    if len(text) <= _MAX_INT_DIGITS:
        return int(text)
    return float("-inf") if text.startswith("-") else float("inf")


_DECODER = json.JSONDecoder()
_SAFE_DECODER = json.JSONDecoder(parse_int=_bounded_int)

# why a duration event (one with ``dur`` and ``cat``) was not kept; counted per file
DROP_TS_TYPE = "ts missing or not a number"
DROP_TS_RANGE = "ts not finite or beyond 2^53 us"
DROP_DUR_TYPE = "dur not a number"
DROP_DUR_NEGATIVE = "negative dur"
DROP_DUR_RANGE = "dur not finite or beyond 2^53 us"
NOT_OBJECT = "traceEvents element that is not an object"
ID_CLAMPED = "stream/correlation/external id beyond int64 (set to -1)"
BW_CLAMPED = "memory bandwidth not a finite number >= 0 (set to 0)"
BW_ARG = "memory bandwidth (GB/s)"


class TraceFormatError(Exception):
    """A trace file is missing, truncated or not a Kineto trace; the message names the file."""


@dataclass
class RankEvents:
    """The duration events of one trace file, in file order (``dur`` and ``cat`` present, ``cat != Trace``).

    ``index`` is the event's position in ``traceEvents``; ``ts``/``dur`` are microseconds after the
    HTA-compatible rounding of nanosecond-resolution traces; ``stream``/``correlation``/``external_id``
    are -1 when absent; ``name``/``cat`` index into ``names``.
    """

    path: str
    rank: int
    index: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    name: np.ndarray
    cat: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    names: list[str]
    memory_bw: np.ndarray | None = None  # GB/s from args "memory bandwidth (GB/s)" of GPU events, else 0
    meta: dict = field(default_factory=dict)
    ts_rounded: bool = False
    dropped: dict = field(default_factory=dict)  # reason -> events not kept (see DROP_*)
    clamped: dict = field(default_factory=dict)  # reason -> events kept with a field replaced

    def __len__(self) -> int:
        return len(self.index)


class _Text:
    """Chunked text reader over a plain or gzip'd file with a sliding buffer."""

    def __init__(self, path: str, chunk_chars: int = CHUNK_CHARS):
        self.path = path
        self.chunk_chars = chunk_chars
        raw = open(path, "rb")
        head = raw.read(2)
        raw.seek(0)
        self._fh = gzip.open(raw, "rt", encoding="utf-8-sig") if head == b"\x1f\x8b" else open(
            path, "rt", encoding="utf-8-sig")
        if head == b"\x1f\x8b":
            self._raw = raw
        else:
            raw.close()
            self._raw = None
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.rank: int | None = None
        self._tail = ""

    def close(self) -> None:
        self._fh.close()
        if self._raw is not None:
            self._raw.close()

    def more(self) -> bool:
        """Read another chunk into the buffer (dropping consumed text); False at end of file."""
        if self.eof:
            return False
        try:
            chunk = self._fh.read(self.chunk_chars)
        except (EOFError, OSError, zlib.error, UnicodeDecodeError) as exc:
            raise TraceFormatError(f"{self.path}: cannot read ({exc.__class__.__name__}: {exc})") from None
        if not chunk:
            self.eof = True
            return False
        if self.rank is None:
            text = self._tail + chunk
            m = _RANK_RE.search(text)
            if m:
                digits = m.group(1)
                if len(digits) > 9 or int(digits) > MAX_RANK:
                    raise self.error(f'"rank": {digits[:20]} is not a plausible rank (0 to {MAX_RANK})')
                self.rank = int(digits)
            else:
                self._tail = text[-64:]
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def skip_ws(self) -> str:
        """Skip whitespace; return the next character ('' at end of file)."""
        while True:
            buf, pos = self.buf, self.pos
            n = len(buf)
            while pos < n and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < n:
                return buf[pos]
            if not self.more():
                return ""

    def expect(self, ch: str) -> None:
        got = self.skip_ws()
        if got != ch:
            raise self.error(f"expected {ch!r}, found {got or 'end of file'!r}")
        self.pos += 1

    def value(self):
        """Decode one JSON value at the cursor, reading more text as needed."""
        self.skip_ws()
        decoder = _DECODER
        while True:
            try:
                val, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # a value cut by the end of the buffer fails near the end, or inside a string
                # that started anywhere (a long stack or argument list): read on and retry
                cut = exc.pos > len(self.buf) - (1 << 20) or exc.msg.startswith("Unterminated string")
                if cut and self.more():
                    continue
                if self.eof and (exc.msg.startswith("Unterminated") or not self.buf[exc.pos:].strip()):
                    raise self.error("truncated JSON (file ends inside a value)") from None
                raise self.error(f"invalid JSON: {exc.msg} (character {exc.pos - self.pos} of an event)") from None
            except ValueError as exc:  # an integer literal of thousands of digits: Python refuses to convert it
                if decoder is _SAFE_DECODER:
                    raise self.error(f"invalid JSON: {exc}") from None
                decoder = _SAFE_DECODER
                continue
            if not self.eof and (end == len(self.buf) or (type(val) in (int, float) and _NUMBER_TAIL.issuperset(
                    self.buf[end:]))) and self.more():
                continue  # a number at the end of the buffer ("0" or "0." of "0.25") may continue in the next chunk
            self.pos = end
            return val

    def error(self, msg: str) -> TraceFormatError:
        return TraceFormatError(f"{self.path}: {msg}")


def _int_or(v, default: int = -1) -> int:
    if type(v) is int:
        return v
    try:
        return int(v)
    except (ValueError, TypeError, OverflowError):
        return default


class _Collector:
    """Accumulates the fields kept from each event into typed arrays (``add`` is a fast closure).

    A duration event whose ``ts`` or ``dur`` is not a finite number in range, or whose ``dur`` is
    negative, is not kept and counted in ``dropped`` by reason; an id beyond int64 becomes -1 and
    is counted in ``clamped``.
    """

    def __init__(self) -> None:
        self.index = array("q")
        self.ts = array("d")
        self.dur = array("d")
        self.name = array("i")
        self.cat = array("i")
        self.stream = array("q")
        self.corr = array("q")
        self.ext = array("q")
        self.bw = array("d")
        self.sym: dict[str, int] = {}
        self.flags = {"ts_float": False}  # any ts fractional or missing -> HTA rounds
        self.count = [0]
        self.dropped: dict[str, int] = {}
        self.clamped: dict[str, int] = {}
        self.add, self.add_struct = self._make_add()

    @property
    def ts_float(self) -> bool:
        return self.flags["ts_float"]

    def add_typed(self, events: list) -> bool:
        """Take a batch of well-typed events (msgspec ``_TypedEvent``) in a few vectorized steps.

        Returns False, having changed nothing, when any kept event needs a per-event decision
        (ts missing, a number out of range, a negative dur, an id beyond int64, a bad bandwidth):
        the caller then feeds the batch event by event, where those are counted."""
        lim = TIME_LIMIT_US
        kept_pos = [i for i, e in enumerate(events) if e.dur is not None and e.cat is not None and e.cat != "Trace"]
        kept = [events[i] for i in kept_pos]
        ts = [e.ts for e in kept]
        if None in ts:
            return False
        try:
            ts_a = np.array(ts, dtype=np.float64)
            dur_a = np.array([e.dur for e in kept], dtype=np.float64)
            args = [e.args for e in kept]
            stream = np.array([-1 if a is None else a.stream for a in args], dtype=np.int64)
            corr = np.array([-1 if a is None else a.correlation for a in args], dtype=np.int64)
            ext = np.array([-1 if a is None else a.external_id if a.external_id is not None else
                            a.external_id_legacy if a.external_id_legacy is not None else -1 for a in args],
                           dtype=np.int64)
            bw = np.array([0.0 if a is None else a.bw for a in args], dtype=np.float64)
        except (OverflowError, TypeError, ValueError):
            return False
        if len(kept) and not ((np.abs(ts_a) < lim).all() and (dur_a >= 0).all() and (dur_a < lim).all()):
            return False
        bw = np.where(stream == -1, 0.0, bw)
        if not ((bw >= 0) & (bw <= lim)).all():
            return False
        names = ["None" if e.name is None else e.name for e in kept]
        cats = [e.cat for e in kept]
        sym = self.sym
        for pair in zip(names, cats):  # ids in first-seen order, name before cat, as put() assigns them
            for x in pair:
                if x not in sym:
                    sym[x] = len(sym)
        if not self.flags["ts_float"] and any(type(e.ts) is not int for e in events):
            self.flags["ts_float"] = True
        base = self.count[0]
        self.count[0] = base + len(events)
        self.index.frombytes((np.array(kept_pos, dtype=np.int64) + base).tobytes())
        self.ts.frombytes(ts_a.tobytes())
        self.dur.frombytes(dur_a.tobytes())
        self.name.frombytes(np.array([sym[x] for x in names], dtype=np.int32).tobytes())
        self.cat.frombytes(np.array([sym[x] for x in cats], dtype=np.int32).tobytes())
        self.stream.frombytes(stream.tobytes())
        self.corr.frombytes(corr.tobytes())
        self.ext.frombytes(ext.tobytes())
        self.bw.frombytes(bw.tobytes())
        return True

    def _make_add(self):
        a_index, a_ts, a_dur = self.index.append, self.ts.append, self.dur.append
        a_name, a_cat = self.name.append, self.cat.append
        streams, corrs, exts = self.stream, self.corr, self.ext
        a_stream, a_corr, a_ext = streams.append, corrs.append, exts.append
        a_bw = self.bw.append
        sym, flags, count, dropped, clamped = self.sym, self.flags, self.count, self.dropped, self.clamped
        lim = TIME_LIMIT_US

        def drop(reason: str) -> None:
            dropped[reason] = dropped.get(reason, 0) + 1

        def put(i, ts, dur, cat, name, stream, corr, ext, bw) -> None:
            """Keep one duration event (``ts``/``dur``/``cat`` present, ``cat != Trace``) or count why not."""
            t_ts = type(ts)
            if t_ts is not int and t_ts is not float:
                return drop(DROP_TS_TYPE)
            if not -lim <= ts <= lim:  # NaN fails too
                return drop(DROP_TS_RANGE)
            t_dur = type(dur)
            if t_dur is not int and t_dur is not float:
                return drop(DROP_DUR_TYPE)
            if not 0 <= dur <= lim:
                return drop(DROP_DUR_NEGATIVE if dur < 0 else DROP_DUR_RANGE)
            if type(name) is not str:
                name = str(name)
            if type(cat) is not str:
                cat = str(cat)
            nid = sym.get(name)
            if nid is None:
                nid = sym[name] = len(sym)
            cid = sym.get(cat)
            if cid is None:
                cid = sym[cat] = len(sym)
            if type(stream) is not int:
                stream = _int_or(stream)
            if type(corr) is not int:
                corr = _int_or(corr)
            if type(ext) is not int:
                ext = _int_or(ext)
            if stream == -1:
                bw = 0.0
            elif type(bw) is not float or not 0.0 <= bw <= lim:
                bw = _bandwidth(bw, clamped)
            n = len(streams)
            try:
                a_stream(stream)
                a_corr(corr)
                a_ext(ext)
            except OverflowError:  # an id beyond int64: keep the event, the id becomes "absent"
                del streams[n:], corrs[n:], exts[n:]
                a_stream(stream if -_I64 <= stream < _I64 else -1)
                a_corr(corr if -_I64 <= corr < _I64 else -1)
                a_ext(ext if -_I64 <= ext < _I64 else -1)
                clamped[ID_CLAMPED] = clamped.get(ID_CLAMPED, 0) + 1
            a_index(i)
            a_ts(ts)
            a_dur(dur)
            a_name(nid)
            a_cat(cid)
            a_bw(bw)

        def add(e) -> None:
            """One decoded element of ``traceEvents`` (a dict for events)."""
            i = count[0]
            count[0] = i + 1
            if type(e) is not dict:
                drop(NOT_OBJECT)
                return
            get = e.get
            ts = get("ts")
            if type(ts) is not int:
                flags["ts_float"] = True
            dur = get("dur")
            cat = get("cat")
            if dur is None or cat is None or cat == "Trace":
                return  # not a duration event: instant, counter, flow or metadata
            args = get("args")
            if type(args) is dict:
                aget = args.get
                ext = aget("External id")
                if ext is None:
                    ext = aget("external id", -1)
                put(i, ts, dur, cat, get("name"), aget("stream", -1), aget("correlation", -1), ext,
                    aget(BW_ARG, 0.0))
            else:
                put(i, ts, dur, cat, get("name"), -1, -1, -1, 0.0)

        def add_struct(e) -> None:
            """One event decoded by msgspec into :class:`_Event` (same rules as ``add``)."""
            i = count[0]
            count[0] = i + 1
            ts = e.ts
            if type(ts) is not int:
                flags["ts_float"] = True
            dur = e.dur
            cat = e.cat
            if dur is None or cat is None or cat == "Trace":
                return
            args = e.args
            if args is None:
                put(i, ts, dur, cat, e.name, -1, -1, -1, 0.0)
            else:
                ext = args.external_id
                if ext is None:
                    ext = args.external_id_legacy
                put(i, ts, dur, cat, e.name, args.stream, args.correlation, ext, args.bw)
        return add, add_struct


def _bandwidth(v, clamped: dict) -> float:
    """A memory bandwidth arg (GB/s) as a finite float >= 0; anything else counts as clamped and is 0."""
    if type(v) is int and 0 <= v <= TIME_LIMIT_US:
        return float(v)
    if type(v) is float and 0.0 <= v <= TIME_LIMIT_US:
        return v
    clamped[BW_CLAMPED] = clamped.get(BW_CLAMPED, 0) + 1
    return 0.0


def _downcast_int(a: np.ndarray) -> np.ndarray:
    """Smallest signed integer dtype holding ``a`` (what pandas ``to_numeric(downcast='integer')`` picks)."""
    if a.size == 0:
        return a.astype(np.int8)
    lo, hi = int(a.min()), int(a.max())
    for dt in (np.int8, np.int16, np.int32):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return a.astype(dt)
    return a.astype(np.int64)


def read_trace(path: str, chunk_chars: int = CHUNK_CHARS) -> RankEvents:
    """Stream one trace file into :class:`RankEvents`; raises :class:`TraceFormatError` naming the file.

    ``chunk_chars`` is how much text is decoded per read (memory stays near one chunk plus one event).
    """
    if not os.path.isfile(path):
        raise TraceFormatError(f"{path}: no such file")
    try:
        text = _Text(path, chunk_chars)
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot open ({exc})") from None
    col = _Collector()
    meta: dict = {}
    found = False
    try:
        first = text.skip_ws()
        if first == "[":  # bare array form of the Chrome trace format
            found = True
            _read_array(text, col)
        elif first == "{":
            text.pos += 1
            if text.skip_ws() == "}":
                text.pos += 1
            else:
                while True:
                    key = text.value()
                    if type(key) is not str:
                        raise text.error("invalid JSON: object key is not a string")
                    text.expect(":")
                    if key == "traceEvents" and text.skip_ws() == "[":
                        found = True
                        _read_array(text, col)
                    else:
                        meta[key] = text.value()
                    c = text.skip_ws()
                    text.pos += 1
                    if c == "}":
                        break
                    if c != ",":
                        raise text.error("truncated JSON" if c == "" else f"invalid JSON: unexpected {c!r}")
        else:
            raise text.error("not a JSON trace (expected '{' or '[' at the start)")
        if text.skip_ws() != "":
            raise text.error("invalid JSON: extra data after the trace object")
    finally:
        text.close()
    if not found:
        raise TraceFormatError(f"{path}: no 'traceEvents' array: not a Kineto/Chrome trace")
    if not len(col.index):
        raise TraceFormatError(f"{path}: {_no_events(col)}: not a PyTorch profiler trace")
    rank = text.rank if text.rank is not None else 0
    return _finish(path, rank, col, meta)


def _read_array(text: _Text, col: _Collector) -> None:
    text.expect("[")
    if text.skip_ws() == "]":
        text.pos += 1
        return
    add = col.add
    single = 0  # events left to decode one by one after a failed batch
    while True:
        if single <= 0:
            if _batch(text, col):
                continue
            single = 256
        single -= 1
        add(text.value())
        c = text.skip_ws()
        text.pos += 1
        if c == "]":
            return
        if c != ",":
            raise text.error("truncated JSON" if c == "" else f"invalid JSON in traceEvents: unexpected {c!r}")


_loads = _fast_json.loads if _fast_json is not None else json.loads
JSON_BACKEND = "msgspec" if _msgspec is not None else "orjson" if _fast_json is not None else "json"
_decode_structs = None
if _msgspec is not None:
    from typing import Any

    class _Args(_msgspec.Struct):
        """The ``args`` fields kept; any JSON type is accepted here and checked in ``put``."""

        stream: Any = -1
        correlation: Any = -1
        external_id: Any = _msgspec.field(name="External id", default=None)
        external_id_legacy: Any = _msgspec.field(name="external id", default=None)
        bw: Any = _msgspec.field(name=BW_ARG, default=0.0)

    class _Event(_msgspec.Struct):
        """The event fields kept; other keys are skipped by the decoder without being built."""

        ts: Any = None
        dur: Any = None
        cat: Any = None
        name: Any = None
        args: _Args | None = None

    class _TypedArgs(_msgspec.Struct):
        """``args`` as well-formed traces have them (the decoder refuses anything else)."""

        stream: int = -1
        correlation: int = -1
        external_id: int | None = _msgspec.field(name="External id", default=None)
        external_id_legacy: int | None = _msgspec.field(name="external id", default=None)
        bw: float = _msgspec.field(name=BW_ARG, default=0.0)

    class _TypedEvent(_msgspec.Struct):
        """An event as well-formed traces have it (numbers where numbers belong)."""

        ts: int | float | None = None
        dur: int | float | None = None
        cat: str | None = None
        name: str | None = None
        args: _TypedArgs | None = None

    _decode_structs = _msgspec.json.Decoder(list[_Event]).decode
    _decode_typed = _msgspec.json.Decoder(list[_TypedEvent]).decode


def _decode_piece(piece: str, col: _Collector) -> bool:
    """Decode a JSON array of events and feed the collector; False when it is not valid JSON.

    Fastest first: well-typed events in one vectorized intake, then any-typed structs event by
    event, then whole dicts (orjson or the standard library). Each path applies the same rules."""
    if _decode_structs is not None:
        try:
            if col.add_typed(_decode_typed(piece)):
                return True
        except _msgspec.DecodeError:  # a field of an unexpected type (or invalid JSON)
            pass
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


def _batch(text: _Text, col: _Collector) -> bool:
    """Decode many events with one decoder call: from the cursor (an event start) up to the last
    ``},`` in the buffer. A cut inside a string or a nested value cannot parse, so a successful
    parse always ends on an event boundary. False when no batch could be taken."""
    if len(text.buf) - text.pos < (1 << 16) and not text.eof:
        text.more()
    buf, pos = text.buf, text.pos
    cut = len(buf)
    for _ in range(4):
        cut = buf.rfind("},", pos, cut)
        if cut <= pos:
            return False
        if _decode_piece("[" + buf[pos:cut + 1] + "]", col):
            text.pos = cut + 2
            return True
    return False


def _no_events(col: _Collector) -> str:
    if not col.count[0]:
        return "'traceEvents' is empty"
    if col.dropped:
        return f"no usable duration event ({describe_counts(col.dropped)})"
    return f"none of the {col.count[0]} elements of 'traceEvents' is a duration event (with ts, dur and cat)"


def describe_counts(counts: dict[str, int]) -> str:
    """``{"negative dur": 2}`` -> ``"negative dur: 2"``, largest first."""
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _finish(path: str, rank: int, col: _Collector, meta: dict) -> RankEvents:
    ts = np.frombuffer(col.ts, dtype=np.float64)
    dur = np.frombuffer(col.dur, dtype=np.float64)
    if col.ts_float:
        # HTA rounds nanosecond-resolution traces: start up, end down (pytorch#122425)
        end = np.floor(ts + dur)
        ts = np.ceil(ts)
        dur = end - ts
        ts_out = ts.astype(np.int64)
    else:
        ts_out = _downcast_int(ts.astype(np.int64))
    names = [None] * len(col.sym)
    for s, i in col.sym.items():
        names[i] = s
    return RankEvents(
        path=path, rank=rank,
        index=np.frombuffer(col.index, dtype=np.int64),
        ts=ts_out, dur=np.array(dur, dtype=np.float64),
        name=np.frombuffer(col.name, dtype=np.int32), cat=np.frombuffer(col.cat, dtype=np.int32),
        stream=np.frombuffer(col.stream, dtype=np.int64),
        correlation=np.frombuffer(col.corr, dtype=np.int64),
        external_id=np.frombuffer(col.ext, dtype=np.int64),
        memory_bw=np.frombuffer(col.bw, dtype=np.float64),
        names=names, meta=meta, ts_rounded=col.ts_float,
        dropped=dict(col.dropped), clamped=dict(col.clamped),
    )

