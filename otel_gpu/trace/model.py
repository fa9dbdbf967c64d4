"""A folder of per-rank traces, filtered the way HTA 0.5.0 loads them.

HTA keeps, per rank, a table of duration events. With two or more distinct ``ProfilerStep``
names it keeps only CPU events that start before the last step and the GPU events whose
correlation id matches one of them (a GPU event matched by k CPU events appears k times,
as in HTA's inner merge), GPU rows first. :class:`RankView` holds that row order as an
index array into :class:`~otel_gpu.trace.parse.RankEvents`; all times are microseconds
relative to the earliest event of the whole set.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..words import count, noun
from .listing import list_traces
from .parse import RankEvents, TraceFormatError, describe_counts, read_trace
from .rank_pool import frozen_heap

COMMUNICATION, MEMORY, COMPUTATION, OTHER = "COMMUNICATION", "MEMORY", "COMPUTATION", "OTHER"
_COMM_RE = re.compile(r"^nccl.*Kernel")
_MEM_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
SYNC_EVENT_NAMES = ("Event Sync", "Context Sync")


@lru_cache(maxsize=1 << 16)
def kernel_type(name: str) -> str:
    """HTA's kernel classification by name: communication, memory, computation or other."""
    if _COMM_RE.match(name):
        return COMMUNICATION
    if _MEM_RE.match(name):
        return MEMORY
    if not _NOT_COMPUTE_RE.match(name):
        return COMPUTATION
    return OTHER


@dataclass
class RankView:
    """One rank's events in HTA's row order (``rows`` indexes ``ev``; repeats allowed)."""

    rank: int
    ev: RankEvents
    rows: np.ndarray
    index_correlation: np.ndarray  # per event of ev (not per row): HTA's index_correlation
    ts0: int = 0  # subtracted from ts (earliest event of the set)
    last_step_dropped: bool = False  # HTA's rule removed the last ProfilerStep's events
    _types: list[str] | None = field(default=None, repr=False)
    _type_table: np.ndarray | None = field(default=None, repr=False)
    _ids: dict[str, int] | None = field(default=None, repr=False)  # name -> symbol id
    _cache: dict = field(default_factory=dict, repr=False)  # results several analyses share (see cached)

    def cached(self, key: str, make):
        """``make()``, computed once until :meth:`clear_cache` (series several analyses read;
        callers must not modify what it returns)."""
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = make()
        return got

    def clear_cache(self) -> None:
        self._cache.clear()

    @property
    def names(self) -> list[str]:
        return self.ev.names

    def col(self, name: str) -> np.ndarray:
        """A column of ``ev`` in row order (``ts`` relative to the set's start)."""
        a = getattr(self.ev, name)[self.rows]
        if name == "ts":
            a = a - self.ts0
        return a

    def name_types(self) -> list[str]:
        """Kernel type of every symbol in ``names``."""
        if self._types is None:
            self._types = [kernel_type(n) for n in self.ev.names]
        return self._types

    def type_of_rows(self, rows_name: np.ndarray) -> np.ndarray:
        """Kernel type (object array of str) of each name id."""
        if self._type_table is None:
            self._type_table = np.array(self.name_types() or [OTHER], dtype=object)
        return self._type_table[rows_name] if len(rows_name) else np.array([], dtype=object)

    def symbol_ids(self, wanted) -> np.ndarray:
        """Ids of the given symbol names present in this rank."""
        if self._ids is None:
            self._ids = {n: i for i, n in enumerate(self.ev.names)}
        ids = self._ids
        return np.array(sorted({ids[n] for n in wanted if n in ids}), dtype=np.int32)


def id_in(ev: RankEvents, codes: np.ndarray, ids) -> np.ndarray:
    """``np.isin(codes, ids)`` for symbol ids of ``ev`` (name or category codes), by a look-up
    table indexed by id: a few microseconds where np.isin costs tens."""
    table = np.zeros(len(ev.names), dtype=bool)
    table[np.asarray(ids, dtype=np.intp)] = True
    return table[codes]


@dataclass
class TraceSet:
    """All ranks of one run, HTA-filtered, plus what the loader noticed."""

    path: str
    ranks: dict[int, RankView]
    notes: list[str]
    steps_filtered: bool


def _is_gpu(ev: RankEvents) -> np.ndarray:
    """HTA's GPU-kernel filter: stream >= 0 and correlation >= 0, or a device sync event."""
    mask = (ev.stream >= 0) & (ev.correlation >= 0)
    sync_ids = [i for i, n in enumerate(ev.names) if n in SYNC_EVENT_NAMES]
    if sync_ids:
        mask |= np.isin(ev.name, sync_ids)
    return mask


def _index_correlation(ev: RankEvents, gpu: np.ndarray) -> np.ndarray:
    """HTA's index_correlation: for a CPU event the index of the last GPU event with its
    correlation, for a GPU event the last CPU one; 0 when unmatched, -1 without correlation."""
    ic = np.minimum(ev.correlation, 0).astype(np.int64)
    has = ev.correlation != -1
    for src, dst in ((has & ~gpu, has & gpu), (has & gpu, has & ~gpu)):
        src_pos = np.flatnonzero(src)
        dst_pos = np.flatnonzero(dst)
        if not len(src_pos) or not len(dst_pos):
            continue
        # the last dst event (file order) for each correlation value
        dcorr = ev.correlation[dst_pos]
        order = np.argsort(dcorr, kind="stable")
        sc = dcorr[order]
        last = np.concatenate((sc[1:] != sc[:-1], [True]))
        keys, last_pos = sc[last], dst_pos[order][last]
        scorr = ev.correlation[src_pos]
        j = np.searchsorted(keys, scorr)
        j[j >= len(keys)] = 0
        ok = keys[j] == scorr if len(keys) else np.zeros(len(scorr), bool)
        ic[src_pos[ok]] = ev.index[last_pos[j[ok]]]
    return ic


def _filter_rows(ev: RankEvents, gpu: np.ndarray) -> np.ndarray:
    """HTA's last-step filter: GPU rows (repeated per matching CPU row), then CPU rows."""
    cpu = ~gpu
    step_ids = [i for i, n in enumerate(ev.names) if "ProfilerStep" in n]
    step_rows = cpu & np.isin(ev.name, step_ids)
    if not step_rows.any():
        return np.array([], dtype=np.int64)
    last_start = ev.ts[step_rows].max()
    cpu_keep = np.flatnonzero(cpu & (ev.ts < last_start))
    gpu_pos = np.flatnonzero(gpu)
    ccorr = np.sort(ev.correlation[cpu_keep])
    gcorr = ev.correlation[gpu_pos]
    mult = np.searchsorted(ccorr, gcorr, "right") - np.searchsorted(ccorr, gcorr, "left")
    return np.concatenate([np.repeat(gpu_pos, mult), cpu_keep]).astype(np.int64)


def find_trace_files(directory: str) -> tuple[list[str], list[str]]:
    """The ``.json`` / ``.json.gz`` / ``.gz`` files of a folder, sorted by name, and a note for each
    entry so named that is not a regular file (skipped, see :mod:`.listing`)."""
    if not os.path.isdir(directory):
        raise TraceFormatError(f"{directory}: not a folder")
    try:
        files, skipped = list_traces(directory)
    except OSError as exc:
        raise TraceFormatError(f"{directory}: cannot list ({exc.strerror or exc})") from None
    if not files:
        raise TraceFormatError(f"{directory}: no .json or .json.gz trace files"
                               + (f" ({'; '.join(skipped)})" if skipped else ""))
    return files, skipped


PARALLEL_MIN_BYTES = 1 << 20  # files on disk; below this one process reads everything


def derive(ev: RankEvents) -> tuple[np.ndarray, np.ndarray]:
    """What loading needs of one rank alone: (HTA's index_correlation, the rows kept when the last
    step is dropped), as int32 where file positions fit it (half the memory)."""
    gpu = _is_gpu(ev)
    ic, last_step_rows = _index_correlation(ev, gpu), _filter_rows(ev, gpu)
    if ev.index.dtype == np.int32:
        return ic.astype(np.int32), last_step_rows.astype(np.int32)
    return ic, last_step_rows


def read_derived(path: str) -> RankEvents:
    """``read_trace`` with ``derive``'s columns kept in ``ev.derived`` (made by the process that reads)."""
    ev = read_trace(path)
    ev.derived = derive(ev)
    return ev


def _read_all(paths: list[str], jobs: int | None, meanwhile=None) -> list[RankEvents]:
    """Read files, in worker processes (fork) when there are several files and cores; ``meanwhile()``
    (optional) runs in this process while they read."""
    if jobs is None:  # worker processes pay off only beyond a few MB of traces
        big = sum(os.path.getsize(p) for p in paths) > PARALLEL_MIN_BYTES
        jobs = (os.cpu_count() or 1) if big else 1
    jobs = min(len(paths), jobs)
    if jobs <= 1 or "fork" not in mp.get_all_start_methods():
        if meanwhile is not None:
            meanwhile()
        return [read_derived(p) for p in paths]
    from concurrent.futures import ProcessPoolExecutor   # (here: 0.7 MB the set_workers path never needs)
    with frozen_heap(), ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
        got = pool.map(read_derived, paths)   # every file handed out at once; results in order
        if meanwhile is not None:
            meanwhile()
        return list(got)


def load_events(paths: list[str], jobs: int | None = None,
                meanwhile=None) -> tuple[dict[int, RankEvents], list[str]]:
    """Read every file (``jobs`` processes, default one per core); rank from the file (HTA's rule),
    a later file wins on a duplicate rank."""
    out: dict[int, RankEvents] = {}
    notes: list[str] = []
    for ev in _read_all(paths, jobs, meanwhile):
        ev.names = [sys.intern(n) for n in ev.names]  # ranks share their kernel and op names
        notes += read_notes(ev)
        if ev.rank in out:
            notes.append(duplicate_note(ev.rank, out[ev.rank].path, ev.path))
        out[ev.rank] = ev
    return out, notes


def read_notes(ev: RankEvents) -> list[str]:
    """What reading one file noticed: events dropped, rounded or kept with a field cleared."""
    p, notes = ev.path, []
    if ev.dropped:
        notes.append(f"{p}: {count(sum(ev.dropped.values()), 'event')} not analysed ({describe_counts(ev.dropped)})")
    if ev.rounded_short:
        notes.append(f"{p}: {count(ev.rounded_short, 'event')} shorter than 1 us end before they start once times are "
                     "rounded to whole us (start up, end down, as HTA does for nanosecond traces): 0 us here, "
                     "-1 us in HTA")
    if ev.clamped:
        notes.append(f"{p}: {count(sum(ev.clamped.values()), 'event')} kept with a field cleared "
                     f"({describe_counts(ev.clamped)})")
    return notes


def duplicate_note(rank: int, before: str, after: str) -> str:
    return f"rank {rank} appears in {before} and {after}; using {after}"


def step_names(ev: RankEvents) -> set[str]:
    """The rank's ``ProfilerStep`` names (HTA's last-step rule counts them over the whole set)."""
    return {n for n in ev.names if "ProfilerStep" in n}


def step_rule(names: set[str], include_last_step: bool) -> tuple[bool, str]:
    """(whether the last step is dropped, the note saying so) from the set's step names."""
    if not names:
        return False, "no ProfilerStep annotations: every kernel in the trace is analysed"
    if len(names) == 1:
        return False, "only one ProfilerStep: every kernel in the trace is analysed"
    if include_last_step:
        return False, "last ProfilerStep kept (--include-last-step)"
    return True, "kernels launched in the last ProfilerStep are excluded (HTA default)"


def rank_view(ev: RankEvents, filtered: bool, ts0: int) -> RankView:
    """One rank as HTA keeps it (``ts0``: the set's earliest event, us); frees ``ev.derived``."""
    ic, last_step_rows = ev.derived or derive(ev)
    ev.derived = None
    small = ev.index.dtype == np.int32  # file positions (and so row numbers) fit int32: half the memory
    rows = last_step_rows if filtered else np.arange(len(ev), dtype=np.int32 if small else np.int64)
    return RankView(ev.rank, ev, rows, ic, ts0=ts0, last_step_dropped=filtered)


def first_ts(ev: RankEvents) -> int | None:
    """The rank's earliest event start (us), None without events."""
    return int(ev.ts.min()) if len(ev) else None


def cpu_only_note(v: RankView) -> str | None:
    if not (v.ev.stream[v.rows] != -1).any():
        return f"rank {v.rank}: no GPU events (CPU-only trace): only CPU-side results"
    return None


def build_set(path: str, events: dict[int, RankEvents], notes: list[str] | None = None,
              include_last_step: bool = False) -> TraceSet:
    """Apply HTA's load-time filtering to already read ranks."""
    notes = list(notes or [])
    filtered, note = step_rule(set().union(*map(step_names, events.values())), include_last_step)
    notes.append(note)
    starts = [t for t in map(first_ts, events.values()) if t is not None]
    ts0 = min(starts) if starts else 0
    views = {rank: rank_view(events[rank], filtered, ts0) for rank in sorted(events)}
    notes += [n for n in map(cpu_only_note, views.values()) if n]
    return TraceSet(path, views, notes, filtered)


def _rank_list(ranks: list[int], shown: int = 8) -> str:
    """[5] -> "rank 5"; [0, 1, 5] -> "ranks 0, 1, 5"; a long list is cut: "ranks 0, 1, ... (1,000 ranks)"."""
    more = f", ... ({count(len(ranks), 'rank')})" if len(ranks) > shown else ""
    return f"{noun(len(ranks), 'rank')} " + ", ".join(map(str, ranks[:shown])) + more


def load_set(directory: str, ranks: list[int] | None = None, include_last_step: bool = False,
             jobs: int | None = None, meanwhile=None) -> TraceSet:
    """Read and filter a folder of per-rank traces (optionally only some ranks); ``meanwhile()``
    (optional) runs while worker processes read the files."""
    files, skipped = find_trace_files(directory)
    events, notes = load_events(files, jobs, meanwhile)
    notes = skipped + notes
    return build_set(directory, asked_ranks(directory, events, ranks), notes, include_last_step)


def asked_ranks(directory: str, found: dict, ranks: list[int] | None) -> dict:
    """``found`` (rank -> anything) cut to the ``ranks`` asked for (all when none); a rank asked for
    that the folder lacks raises TraceFormatError."""
    if not ranks:
        return found
    missing = sorted(set(ranks) - set(found))
    if missing:
        raise TraceFormatError(f"{directory}: no trace for {_rank_list(missing)}; found {_rank_list(sorted(found))}")
    return {r: found[r] for r in ranks}
