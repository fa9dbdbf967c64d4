"""Host synchronisation calls of a rank, told apart by who issued them.

A CUDA sync call (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize`` and
their HIP forms) is **framework-internal** when it runs inside a framework's own scope on the same
CPU thread (``DistributedDataParallel.forward``, FSDP, DeepSpeed, c10d/NCCL/gloo collectives and
the process group), or when it is a ``cudaEventSynchronize`` shorter than ``short_event_us`` (the
event had already completed: nothing drained). Every other sync call is the **user's**: ``.item()``,
``.cpu()``, ``print(tensor)``, ``torch.cuda.synchronize()``, boolean-mask indexing. Times in us,
relative to the set's start.
"""
from __future__ import annotations

import numpy as np

from .breakdown import merge_intervals
from .model import RankView, id_in
from .name_tags import ids_tagged

RUNTIME_SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize")
EVENT_SYNC = ("cudaEventSynchronize", "hipEventSynchronize")
SHORT_EVENT_SYNC_US = 20.0


def cpu_intervals(v: RankView, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) us of rows, relative to the set's start."""
    s0 = (v.ev.ts[rows] - v.ts0).astype(np.float64)
    return s0, s0 + np.maximum(v.ev.dur[rows], 0)


def rows_named(v: RankView, names, rows: np.ndarray | None = None) -> np.ndarray:
    """Rows (default: every kept row) whose event name is one of ``names``."""
    rows = v.rows if rows is None else rows
    return rows[id_in(v.ev, v.ev.name[rows], v.symbol_ids(names))]


def rows_matching(v: RankView, tag: str, cpu_only: bool = True) -> np.ndarray:
    """Kept rows whose name carries ``tag`` (see :mod:`.name_tags`; CPU events only by default)."""
    ids = ids_tagged(v.names, tag)
    rows = v.rows[id_in(v.ev, v.ev.name[v.rows], ids)]
    return rows[v.ev.stream[rows] == -1] if cpu_only else rows


def inside_scope(v: RankView, rows: np.ndarray, scope: np.ndarray) -> np.ndarray:
    """Whether each of ``rows`` lies wholly inside one of the ``scope`` rows' intervals on the same
    CPU thread (any thread when the reader kept none)."""
    out = np.zeros(len(rows), dtype=bool)
    if not len(rows) or not len(scope):
        return out
    threads = v.ev.thread
    r_thr = threads[rows] if threads is not None else np.zeros(len(rows), np.int64)
    s_thr = threads[scope] if threads is not None else np.zeros(len(scope), np.int64)
    r0, r1 = cpu_intervals(v, rows)
    for t in np.unique(r_thr).tolist():
        mine = r_thr == t
        a0, a1 = cpu_intervals(v, scope[s_thr == t])
        if not len(a0):
            continue
        cs, ce = merge_intervals(a0, a1)
        j = np.searchsorted(cs, r0[mine], "right") - 1
        ok = j >= 0
        ok[ok] &= r1[mine][ok] <= ce[j[ok]]
        out[mine] = ok
    return out


def classify_syncs(v: RankView, short_event_us: float = SHORT_EVENT_SYNC_US) -> dict[str, np.ndarray]:
    """Sync call rows of a rank: ``rows``, and masks over them: ``framework`` (inside a framework's
    scope), ``short_event`` (an event sync under ``short_event_us``), ``user`` (neither)."""
    rows = rows_named(v, RUNTIME_SYNC)
    rows = rows[v.ev.stream[rows] == -1]
    framework = inside_scope(v, rows, rows_matching(v, "framework"))
    short_event = (id_in(v.ev, v.ev.name[rows], v.symbol_ids(EVENT_SYNC)) & (v.ev.dur[rows] < short_event_us)
                   & ~framework)
    return {"rows": rows, "framework": framework, "short_event": short_event, "user": ~framework & ~short_event}


def scopes_of(v: RankView, rows: np.ndarray, top: int = 3, sample: int = 200) -> list[list]:
    """The innermost framework scopes (names) the given sync rows ran in, most frequent first
    (over the first ``sample`` rows)."""
    scope = rows_matching(v, "framework")
    if not len(rows) or not len(scope):
        return []
    threads = v.ev.thread
    s0, s1 = cpu_intervals(v, scope)
    r0, r1 = cpu_intervals(v, rows[:sample])
    counts: dict[str, int] = {}
    for i, row in enumerate(rows[:sample].tolist()):
        hit = (s0 <= r0[i]) & (s1 >= r1[i])
        if threads is not None:
            hit &= threads[scope] == threads[row]
        if hit.any():
            j = np.flatnonzero(hit)
            name = v.names[int(v.ev.name[scope[j[np.argmax(s0[j])]]])]  # the innermost: latest start
            counts[name] = counts.get(name, 0) + 1
    return [[n, c] for n, c in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]
