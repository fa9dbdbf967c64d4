"""Streaming reader for PyTorch profiler (Kineto) Chrome-trace JSON files.

The file is never loaded whole: text is decoded in chunks (gzip streamed too) and each
element of ``traceEvents`` is decoded on its own, then reduced to a few numbers kept in
compact numpy arrays (:class:`RankEvents`). Times are microseconds (us).
"""
from __future__ import annotations

import json
import os
import re
from array import array
from dataclasses import dataclass, field

import numpy as np

from ..safe_text import no_surrogates
from ..words import count
from . import gz
from .gz import open_text
from .intake import NOT_OBJECT, TIME_LIMIT_US, Collector  # noqa: F401 (re-exported)

CHUNK_CHARS = 1 << 18  # characters of text per read: 256 Ki (larger chunks read slower: the decoded batch
# no longer fits the CPU caches; 4 Mi took 240 ms for a 120k-event file, 512 Ki 170 ms; on a 2 MiB-L2
# machine 256 Ki read the DLRM-style set's ranks in 27.4 ms against 29.4 ms at 512 Ki and 34.7 ms at 1 Mi)
_WS = " \t\r\n"
_NUMBER_TAIL = frozenset("0123456789.eE+-")
_RANK_RE = re.compile(r'"rank":[^\S\n]+(\d+)')  # HTA's rank detection: first match, one line
MAX_RANK = 1 << 24
MAX_NOT_OBJECT = 1000   # traceEvents elements that are not objects before the file is refused (a profiler writes none)
_MAX_INT_DIGITS = 40


def _bounded_int(text: str):
    """JSON integer literal -> int; longer than any int64 -> +-inf (then refused as out of range),
    instead of Python's error on integers of more than 4300 digits."""
    if len(text) <= _MAX_INT_DIGITS:
        return int(text)
    return float("-inf") if text.startswith("-") else float("inf")


_DECODER = json.JSONDecoder()
_SAFE_DECODER = json.JSONDecoder(parse_int=_bounded_int)


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
    bw_index: np.ndarray | None = None  # positions (into these arrays) of events with a memory bandwidth
    bw_value: np.ndarray | None = None  # their args "memory bandwidth (GB/s)"
    meta: dict = field(default_factory=dict)
    ts_rounded: bool = False
    dropped: dict = field(default_factory=dict)  # reason -> events not kept (see DROP_*)
    clamped: dict = field(default_factory=dict)  # reason -> events kept with a field replaced
    rounded_short: int = 0  # events whose rounded duration was below 0 us (kept as 0 us)
    annotation_tid: dict = field(default_factory=dict)  # index of a GPU user annotation -> its tid (-1 if not int)
    thread: np.ndarray | None = None  # per event: code into ``threads`` (int8/int16 when few)
    threads: list = field(default_factory=list)  # code -> (pid, tid) as in the file (int or str)
    sync_args: dict = field(default_factory=dict)  # index of a cuda_sync event -> (wait_on_stream, event corr id)
    derived: tuple | None = None  # what loading derives from this rank alone, made where it was read (model.derive)

    def __len__(self) -> int:
        return len(self.index)

    def memory_bw(self, rows: np.ndarray) -> np.ndarray:
        """Memory bandwidth (GB/s) of the events at ``rows``; 0 where the event has none."""
        out = np.zeros(len(rows), dtype=np.float64)
        if self.bw_index is None or not len(self.bw_index) or not len(rows):
            return out
        j = np.minimum(np.searchsorted(self.bw_index, rows), len(self.bw_index) - 1)
        hit = self.bw_index[j] == rows
        out[hit] = self.bw_value[j[hit]]
        return out


class _Text:
    """Chunked text reader over a plain or gzip'd file with a sliding buffer."""

    def __init__(self, path: str, chunk_chars: int = CHUNK_CHARS):
        self.path = path
        self.chunk_chars = chunk_chars
        raw = open(path, "rb")
        head = raw.read(2)
        raw.seek(0)
        self._fh = open_text(raw) if head == b"\x1f\x8b" else open(
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
        except gz.READ_ERRORS as exc:   # (isal's error is there once isal is loaded)
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
            except RecursionError:  # the decoder recurses per level: thousands of nested levels are no trace event
                raise self.error("invalid JSON: values nested too deeply to decode") from None
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
    col = Collector()
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


def _read_array(text: _Text, col: Collector) -> None:
    text.expect("[")
    if text.skip_ws() == "]":
        text.pos += 1
        return
    add = col.add
    dropped = col.dropped
    single = 0  # events left to decode one by one after a failed batch
    while True:
        if dropped.get(NOT_OBJECT, 0) > MAX_NOT_OBJECT:   # what is decoded one by one is slow: refused early
            raise text.error(f"'traceEvents' holds more than {MAX_NOT_OBJECT:,} elements that are not objects: "
                             "not a PyTorch profiler trace")
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


def _batch(text: _Text, col: Collector) -> bool:
    """Decode many events with one decoder call: from the cursor (an event start) up to the last
    ``},`` in the buffer. A cut inside a string or a nested value cannot parse, so a successful
    parse always ends on an event boundary. False when no batch could be taken."""
    if len(text.buf) - text.pos < (1 << 16) and not text.eof:
        text.more()
    from .decoders import decode_piece   # (loaded by the first read: see decoders)

    buf, pos = text.buf, text.pos
    cut = len(buf)
    for _ in range(4):
        cut = buf.rfind("},", pos, cut)
        if cut <= pos:
            return False
        if decode_piece("[" + buf[pos:cut + 1] + "]", col):
            text.pos = cut + 2
            return True
    return False


def _no_events(col: Collector) -> str:
    if not col.count[0]:
        return "'traceEvents' is empty"
    if col.dropped:
        return f"no usable duration event ({describe_counts(col.dropped)})"
    return (f"no duration event (with ts, dur and cat) among the {count(col.count[0], 'element')} of "
            "'traceEvents'")


def describe_counts(counts: dict[str, int]) -> str:
    """``{"negative dur": 2}`` -> ``"negative dur: 2"``, largest first."""
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _narrow(a: np.ndarray) -> np.ndarray:
    """int32 when every value fits (ids and positions usually do), else int64: memory per event."""
    if a.size == 0 or (int(a.min()) >= -(1 << 31) and int(a.max()) < (1 << 31)):
        return a.astype(np.int32)
    return a


def _symbols(ids: array, n: int) -> np.ndarray:
    """Symbol ids in int16 when fewer than 32768 symbols (traces have hundreds), else int32."""
    a = np.frombuffer(ids, dtype=np.int32)
    return a.astype(np.int16) if n < (1 << 15) else a.copy()


def _kept_tids(col: Collector) -> dict[int, int]:
    """Thread ids of the GPU user annotations that were kept (-1 when not an integer)."""
    if not col.annotation_tid:
        return {}
    keys = np.fromiter(col.annotation_tid, dtype=np.int64, count=len(col.annotation_tid))
    kept = keys[np.isin(keys, np.frombuffer(col.index, dtype=np.int64))].tolist()
    return {i: (t if type(t) is int else -1) for i in kept for t in (col.annotation_tid[i],)}


def _kept_sync(col: Collector) -> dict[int, tuple]:
    """The sync arguments of the cuda_sync events that were kept."""
    if not col.sync_args:
        return {}
    kept = set(np.frombuffer(col.index, dtype=np.int64).tolist())
    return {i: v for i, v in col.sync_args.items() if i in kept}


def _finish(path: str, rank: int, col: Collector, meta: dict) -> RankEvents:
    ts = np.frombuffer(col.ts, dtype=np.float64)
    dur = np.frombuffer(col.dur, dtype=np.float64)
    rounded_short = 0
    if col.ts_float:
        # HTA rounds nanosecond-resolution traces: start up, end down (pytorch#122425)
        end = np.floor(ts + dur)
        ts = np.ceil(ts)
        dur = end - ts
        # an event shorter than 1 us can end before it starts once rounded: HTA keeps -1 us, which
        # gives impossible figures on short traces (compute over 100%); 0 us changes no figure of
        # any shared set (parity tests) and keeps every share within 0-100%
        rounded_short = int((dur < 0).sum())
        dur = np.maximum(dur, 0)
        ts_out = ts.astype(np.int64)
    else:
        ts_out = _downcast_int(ts.astype(np.int64))
    names = [None] * len(col.sym)
    for s, i in col.sym.items():
        names[i] = no_surrogates(s) if s.__class__ is str else s   # JSON's "\udc80": not writable as UTF-8
    bw = np.frombuffer(col.bw, dtype=np.float64)
    bw_index = np.flatnonzero(bw)
    return RankEvents(
        path=path, rank=rank,
        index=_narrow(np.frombuffer(col.index, dtype=np.int64)),
        ts=ts_out, dur=np.array(dur, dtype=np.float64),
        name=_symbols(col.name, len(names)), cat=_symbols(col.cat, len(names)),
        stream=_downcast_int(np.frombuffer(col.stream, dtype=np.int64)),
        correlation=_narrow(np.frombuffer(col.corr, dtype=np.int64)),
        external_id=_narrow(np.frombuffer(col.ext, dtype=np.int64)),
        bw_index=bw_index, bw_value=bw[bw_index].copy(),
        names=names, meta=meta, ts_rounded=col.ts_float,
        dropped=dict(col.dropped), clamped=dict(col.clamped), rounded_short=rounded_short,
        annotation_tid=_kept_tids(col),
        thread=_downcast_int(np.frombuffer(col.thread, dtype=np.int32)),
        threads=list(col.threads), sync_args=_kept_sync(col),
    )
