"""Intake of decoded trace events: the rules that keep, drop or clear each duration event, whichever
decoder (:mod:`.decoders`) made them (identical results). Times are microseconds (us).
"""
from __future__ import annotations

from array import array
from itertools import chain, compress
from operator import attrgetter

import numpy as np

TIME_LIMIT_US = float(1 << 53)  # |ts| and dur beyond this (about 285 years) cannot be a profiler time
_I64 = 1 << 63

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
GPU_ANNOTATION = "gpu_user_annotation"
CUDA_SYNC = "cuda_sync"
_get_ts = attrgetter("ts")


def _is_kept_cat(cat) -> bool:
    return cat is not None and cat != "Trace"


def _int_or(v, default: int = -1) -> int:
    if type(v) is int:
        return v
    try:
        return int(v)
    except (ValueError, TypeError, OverflowError):
        return default


class Collector:
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
        self.annotation_tid: dict[int, object] = {}  # event position -> tid of GPU user annotations
        self.thread = array("i")  # per kept event: code into ``threads``
        self.threads: dict[tuple, int] = {}  # (pid, tid) as found in the file (int or str) -> code
        self.sync_args: dict[int, tuple] = {}  # event position -> (wait_on_stream, wait_on_cuda_event_record_corr_id)
        self.add, self.add_struct = self._make_add()

    def thread_codes(self, pids: list, tids: list) -> np.ndarray:
        """Codes of (pid, tid) pairs; integer pairs in one vectorized step, anything else pair by pair."""
        codes = self.threads
        p, t = _small_int_array(pids), _small_int_array(tids)
        if p is not None and t is not None:
            off = 1 << 31  # both shifted to 0..2^32-1: one int64 key per pair
            keys = ((p + off).astype(np.uint64) << np.uint64(32)) | (t + off).astype(np.uint64)
            uniq = np.unique(keys)   # a few pairs: each key's place found by a search, not a sort of them all
            if not len(uniq):
                return np.zeros(0, dtype=np.int32)
            place = np.searchsorted(uniq, keys)
            first = np.full(len(uniq), len(keys), dtype=np.int64)   # each pair's first event: codes in the
            np.minimum.at(first, place, np.arange(len(keys)))       # order pairs are first seen, as pair by pair
            table = np.empty(len(uniq), dtype=np.int32)
            for j in np.argsort(first, kind="stable").tolist():
                k = int(uniq[j])
                table[j] = codes.setdefault(((k >> 32) - off, (k & 0xFFFFFFFF) - off), len(codes))
            return table[place]
        return np.array([codes.setdefault((_key(p), _key(t)), len(codes)) for p, t in zip(pids, tids)],
                        dtype=np.int32)

    @property
    def ts_float(self) -> bool:
        return self.flags["ts_float"]

    def add_typed(self, events: list, no_args) -> bool:
        """Take a batch of well-typed events (msgspec ``_TypedEvent``; ``no_args``: the args of an
        event without any) in a few vectorized steps.

        Returns False, having changed nothing, when any kept event needs a per-event decision
        (ts missing, a number out of range, a negative dur, an id beyond int64, a bad bandwidth):
        the caller then feeds the batch event by event, where those are counted. Each field is
        taken once over the whole batch (one list per field: the cheapest attribute reads), the
        kept events then picked by a mask."""
        lim = TIME_LIMIT_US
        n_all = len(events)
        if not n_all:
            return True
        dur_all = [e.dur for e in events]
        ts_all = [e.ts for e in events]
        cat_all = [e.cat for e in events]
        try:
            # a missing dur or ts becomes NaN, which JSON cannot hold otherwise (no NaN literal)
            dur_f = np.array(dur_all, dtype=np.float64)
            ts_f = np.array(ts_all, dtype=np.float64)
        except (OverflowError, TypeError, ValueError):
            return False
        keep = ~np.isnan(dur_f)
        cat_set = set(cat_all)
        if None in cat_set or "Trace" in cat_set:
            keep &= np.fromiter(map(_is_kept_cat, cat_all), dtype=bool, count=n_all)
        every = bool(keep.all())
        if every:
            kept, cats, ts_a, dur_a = events, cat_all, ts_f, dur_f
            kept_pos = np.arange(n_all, dtype=np.int64)
        else:
            mask = keep.tolist()
            kept, cats = list(compress(events, mask)), list(compress(cat_all, mask))
            kept_pos = np.flatnonzero(keep)
            ts_a, dur_a = ts_f[kept_pos], dur_f[kept_pos]
        n = len(kept)
        if np.isnan(ts_a).any():   # a kept event without ts
            return False
        args = [e.args for e in kept]
        if None in args:
            args = [no_args if a is None else a for a in args]
        try:
            stream = np.array([a.stream for a in args], dtype=np.int64)
            corr = np.array([a.correlation for a in args], dtype=np.int64)
            ext = [a.external_id for a in args]
            if None in ext:
                ext = [a.external_id if a.external_id is not None else
                       a.external_id_legacy if a.external_id_legacy is not None else -1 for a in args]
            ext = np.array(ext, dtype=np.int64)
            bw = np.array([a.bw for a in args], dtype=np.float64)
        except (OverflowError, TypeError, ValueError):
            return False
        if n and not ((np.abs(ts_a) < lim).all() and (dur_a >= 0).all() and (dur_a < lim).all()):
            return False
        bw = np.where(stream == -1, 0.0, bw)
        if not ((bw >= 0) & (bw <= lim)).all():
            return False
        base = self.count[0]
        names = [e.name for e in kept]
        if None in names:
            names = ["None" if x is None else x for x in names]
        sym = self.sym
        seen = dict.fromkeys(names)
        seen.update(dict.fromkeys(cats))
        if not sym.keys() >= seen.keys():   # new strings (the file's first batches): ids in first-seen
            # order, name before cat, as put() assigns them: each distinct string once
            for x in dict.fromkeys(chain.from_iterable(zip(names, cats))):
                if x not in sym:
                    sym[x] = len(sym)
        if GPU_ANNOTATION in cats:  # a C-level scan; the loop only where annotations are
            tids = self.annotation_tid
            for i, e in zip(kept_pos.tolist(), kept):
                if e.cat == GPU_ANNOTATION:
                    tids[base + i] = e.tid
        if CUDA_SYNC in cats:
            sync = self.sync_args
            for i, e in zip(kept_pos.tolist(), kept):
                if e.cat == CUDA_SYNC and e.args is not None:
                    sync[base + i] = (e.args.wait_on_stream, e.args.wait_on_event)
        self.thread.frombytes(self.thread_codes([e.pid for e in kept], [e.tid for e in kept]).tobytes())
        if not self.flags["ts_float"] and set(map(type, ts_all)) - {int}:
            self.flags["ts_float"] = True
        self.count[0] = base + n_all
        self.index.frombytes((kept_pos + base).tobytes())
        self.ts.frombytes(ts_a.tobytes())
        self.dur.frombytes(dur_a.tobytes())
        self.name.frombytes(np.fromiter(map(sym.__getitem__, names), dtype=np.int32, count=n).tobytes())
        self.cat.frombytes(np.fromiter(map(sym.__getitem__, cats), dtype=np.int32, count=n).tobytes())
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
        tids = self.annotation_tid
        a_thread, threads, sync = self.thread.append, self.threads, self.sync_args
        lim = TIME_LIMIT_US

        def drop(reason: str) -> None:
            dropped[reason] = dropped.get(reason, 0) + 1

        def put(i, ts, dur, cat, name, stream, corr, ext, bw, thread) -> None:
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
            a_thread(threads.setdefault(thread, len(threads)))
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
            tid = get("tid")
            if cat == GPU_ANNOTATION:
                tids[i] = tid
            thread = (_key(get("pid")), _key(tid))
            args = get("args")
            if type(args) is dict:
                aget = args.get
                ext = aget("External id")
                if ext is None:
                    ext = aget("external id", -1)
                if cat == CUDA_SYNC:
                    sync[i] = (_sync_arg(aget("wait_on_stream", -1)),
                               _sync_arg(aget("wait_on_cuda_event_record_corr_id", -1)))
                put(i, ts, dur, cat, get("name"), aget("stream", -1), aget("correlation", -1), ext,
                    aget(BW_ARG, 0.0), thread)
            else:
                put(i, ts, dur, cat, get("name"), -1, -1, -1, 0.0, thread)

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
            if cat == GPU_ANNOTATION:
                tids[i] = e.tid
            thread = (_key(e.pid), _key(e.tid))
            args = e.args
            if args is None:
                put(i, ts, dur, cat, e.name, -1, -1, -1, 0.0, thread)
            else:
                ext = args.external_id
                if ext is None:
                    ext = args.external_id_legacy
                if cat == CUDA_SYNC:
                    sync[i] = (_sync_arg(args.wait_on_stream), _sync_arg(args.wait_on_event))
                put(i, ts, dur, cat, e.name, args.stream, args.correlation, ext, args.bw, thread)
        return add, add_struct


def _bandwidth(v, clamped: dict) -> float:
    """A memory bandwidth arg (GB/s) as a finite float >= 0; anything else counts as clamped and is 0."""
    if type(v) is int and 0 <= v <= TIME_LIMIT_US:
        return float(v)
    if type(v) is float and 0.0 <= v <= TIME_LIMIT_US:
        return v
    clamped[BW_CLAMPED] = clamped.get(BW_CLAMPED, 0) + 1
    return 0.0



def _small_int_array(values: list) -> np.ndarray | None:
    """``values`` as int64 when every one is an int in [-2^31, 2^31) (checked in C), else None."""
    try:
        a = np.array(values)
    except (OverflowError, TypeError, ValueError):
        return None
    # floats, strings, None and ints beyond int64 give another dtype
    if a.dtype == np.int64 and (not len(a) or (int(a.min()) >= -(1 << 31) and int(a.max()) < (1 << 31))):
        return a
    return None


def _key(v):
    """A pid or tid as kept: int or str; anything else (absent, float, list) as its text."""
    if type(v) is int or type(v) is str:
        return v
    return "" if v is None else str(v)


def _sync_arg(v) -> int:
    return v if type(v) is int else _int_or(v)
