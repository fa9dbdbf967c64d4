"""Why the GPU of a rank was idle: each idle gap attributed to where it falls in the step.

A gap is a span during which no GPU event of the rank runs (between the merged intervals of every
kernel, copy and memset: the idle of the temporal breakdown). What the CPU was doing at the gap's
start, when the GPU ran dry, names its cause, first match wins:

- ``sync_drain``: inside one of the user's sync calls (``.item()``, ``.cpu()``, ``synchronize()``, a
  synchronous device-to-host ``cudaMemcpy``): the CPU waited until the queue drained, so everything it
  does next, until its next launch, is exposed;
- ``framework_sync``: inside a sync a framework issues itself (see :mod:`.sync_calls`);
- ``h2d_copy``: inside a host-to-device copy call (pageable copies block the host);
- ``allocator``: inside ``cudaMalloc``/``cudaFree`` and host allocations;
- ``communication``: inside a CPU-side collective (gloo, c10d, process group), or the gap ends at
  an NCCL kernel;
- ``data_loader``: inside the data loader (``enumerate(DataLoader)#...__next__``);
- ``launch_starvation``: the GPU event that ends the gap was launched by a call still running, or
  not yet started, when the GPU ran dry: the CPU does not issue work fast enough (Python, op
  dispatch, launch overhead);
- ``queued_work_waited``: that GPU event was launched before the GPU ran dry, yet waited
  (cross-stream or event waits, GPU-side dependencies);
- ``unattributed``: its launch call is not in the trace.

A drain's cost does not end with its own gap: the queue it threw away has to be refilled, and until the
CPU is ahead of the GPU again the GPU runs each kernel as soon as it is launched. So the
``launch_starvation`` gaps after a drain (a sync gap that began at least ``REFILL_MIN_WAIT_US`` into its
sync call: the GPU had that much work queued), until the queue is refilled (a launch call returns while
the GPU has at least ``REFILL_LEAD_US`` of work without a gap ahead: the CPU is ahead again; one short
kernel that happens to outlast a launch call is not) or the next drain, become ``sync_refill``: the
drain's. At most the lead the sync threw away (the time it waited for the GPU to run dry) is counted so
per drain: a lead of L us could have hidden at most L us of idle. Launch-bound is left for starvation
with no drain before it.

Times in us, relative to the set's start.
"""
from __future__ import annotations

import numpy as np

from .breakdown import merge_intervals
from .launch import launch_pairs
from .model import COMMUNICATION, RankView
from .steps import step_of
from .sync_calls import cpu_intervals, rows_matching, rows_named

CAUSES = ("sync_drain", "sync_refill", "framework_sync", "h2d_copy", "allocator", "communication", "data_loader",
          "launch_starvation", "queued_work_waited", "unattributed")
LABELS = {"sync_drain": "after a user sync drained the queue",
          "sync_refill": "refilling the queue after a sync drained it", "framework_sync": "framework-internal syncs",
          "h2d_copy": "host-to-device copy calls", "allocator": "cudaMalloc/cudaFree",
          "communication": "communication", "data_loader": "data loader",
          "launch_starvation": "launch starvation", "queued_work_waited": "queued work waiting",
          "unattributed": "launch not in the trace"}
MEMCPY_CALLS = ("cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpy2DAsync", "hipMemcpy", "hipMemcpyAsync",
                "hipMemcpyWithStream")
ALLOC_CALLS = ("cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaHostAlloc",
               "hipMalloc", "hipFree", "hipHostMalloc", "hipHostFree")
SYNC_COPY_CALLS = ("cudaMemcpy", "hipMemcpy")  # synchronous: the host waits for the queue and the copy
REFILL_MIN_WAIT_US = 50.0  # a sync that waited this long for the GPU to run dry threw a queue away
REFILL_LEAD_US = 50.0  # a launch returning with this much GPU work ahead (no gap) ends a refill
END_OF_STEP_PCT = 90.0  # a gap beginning in the last 10% of a step (or crossing into the next) is "end of step"


def partner_rows(v: RankView, rows: np.ndarray) -> np.ndarray:
    """Row (position in ``ev``) of each row's correlated event (launch call <-> GPU event); -1 when none."""
    ev = v.ev
    ic = v.index_correlation[rows].astype(np.int64)
    if not len(ev.index):
        return np.full(len(rows), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(ev.index, ic), len(ev.index) - 1)
    ok = (ic > 0) & (ev.index[pos] == ic)
    return np.where(ok, pos, -1)


def h2d_call_rows(v: RankView) -> np.ndarray:
    """Copy calls whose GPU copy runs host-to-device (``Memcpy HtoD ...``)."""
    calls = rows_named(v, MEMCPY_CALLS)
    calls = calls[v.ev.stream[calls] == -1]
    gpu = partner_rows(v, calls)
    ok = gpu >= 0
    h2d = np.zeros(len(calls), dtype=bool)
    uniq, inv = np.unique(v.ev.name[gpu[ok]], return_inverse=True)
    h2d[ok] = np.array([("HtoD" in v.names[n]) for n in uniq.tolist()], dtype=bool)[inv.reshape(-1)]
    return calls[h2d]


def d2h_sync_copy_rows(v: RankView) -> np.ndarray:
    """Synchronous copy calls (``cudaMemcpy``) whose GPU copy runs device-to-host: the host waits
    for everything queued before it (``.item()`` in older PyTorch)."""
    calls = rows_named(v, SYNC_COPY_CALLS)
    calls = calls[v.ev.stream[calls] == -1]
    gpu = partner_rows(v, calls)
    ok = gpu >= 0
    d2h = np.zeros(len(calls), dtype=bool)
    d2h[ok] = np.array([("DtoH" in v.names[int(n)]) for n in v.ev.name[gpu[ok]].tolist()], dtype=bool)
    return calls[d2h]


def overlap(a0: np.ndarray, a1: np.ndarray, b0: np.ndarray, b1: np.ndarray) -> float:
    """Total overlap (us) of intervals [a0, a1) with the disjoint sorted intervals [b0, b1)."""
    if not len(a0) or not len(b0):
        return 0.0
    cover = np.concatenate(([0.0], np.cumsum(b1 - b0)))

    def before(t: np.ndarray) -> np.ndarray:  # covered time before t
        j = np.searchsorted(b0, t, "right")
        jm = np.maximum(j - 1, 0)
        inside = np.clip(np.minimum(t, b1[jm]) - b0[jm], 0, None)
        return np.where(j > 0, cover[jm] + inside, 0.0)
    return float((before(a1) - before(a0)).sum())


def _merged(v: RankView, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s0, s1 = cpu_intervals(v, rows)
    a, b = merge_intervals(s0, s1)
    return a.astype(np.float64), b.astype(np.float64)


def _inside(t: np.ndarray, merged: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Whether each time lies inside (ends included) one of the merged intervals."""
    cs, ce = merged
    if not len(cs):
        return np.zeros(len(t), dtype=bool)
    j = np.searchsorted(cs, t, "right") - 1
    ok = j >= 0
    ok[ok] &= t[ok] <= ce[j[ok]]
    return ok


def attribute_idle(v: RankView, k: dict, windows: list, syncs: dict) -> dict:
    """Every idle gap of the rank with its cause (index into ``CAUSES``); idle per cause (us) and its
    share (%), the CPU time spent in the data loader and in H2D copy calls during each cause's gaps,
    and the idle in gaps at the end of a step."""
    s, e = merge_intervals(k["ts"], k["end"])
    g0, g1 = e[:-1].astype(np.float64), s[1:].astype(np.float64)
    keep = g1 > g0
    g0, g1 = g0[keep], g1[keep]
    cause = np.full(len(g0), -1, dtype=np.int64)
    order = np.argsort(k["ts"], kind="stable")
    nxt = order[np.minimum(np.searchsorted(k["ts"][order], g1, "left"), max(len(order) - 1, 0))] \
        if len(order) else order
    next_rows = k["rows"][nxt] if len(nxt) else k["rows"][:0]
    data = _merged(v, rows_matching(v, "data_loader"))
    h2d = _merged(v, h2d_call_rows(v))
    sync_rows = syncs["rows"]
    user_syncs = np.concatenate([sync_rows[syncs["user"]], d2h_sync_copy_rows(v)])
    cpu_sets = [("sync_drain", _merged(v, user_syncs)),
                ("framework_sync", _merged(v, sync_rows[~syncs["user"]])),
                ("h2d_copy", h2d), ("allocator", _merged(v, rows_named(v, ALLOC_CALLS))),
                ("communication", _merged(v, rows_matching(v, "comm"))), ("data_loader", data)]
    for name, merged in cpu_sets:
        hit = (cause < 0) & _inside(g0, merged)
        cause[hit] = CAUSES.index(name)
    if len(nxt):
        comm = (cause < 0) & (k["type"][nxt] == COMMUNICATION)
        cause[comm] = CAUSES.index("communication")
        launch = partner_rows(v, next_rows)
        known = launch >= 0
        call_end = np.full(len(g0), -np.inf)
        call_end[known] = (v.ev.ts[launch[known]] - v.ts0) + np.maximum(v.ev.dur[launch[known]], 0)
        cause[(cause < 0) & known & (call_end >= g0)] = CAUSES.index("launch_starvation")
        cause[(cause < 0) & known] = CAUSES.index("queued_work_waited")
    cause[cause < 0] = CAUSES.index("unattributed")
    length = g1 - g0
    refill_of = _refills(v, k, g0, g1, cause, _merged(v, np.concatenate([user_syncs, sync_rows[~syncs["user"]]])))
    total = float(length.sum())
    by = {c: float(length[cause == i].sum()) for i, c in enumerate(CAUSES)}
    fill = {}
    for i, c in enumerate(CAUSES):
        m = cause == i
        if m.any():
            fill[c] = {"data_loader_us": round(overlap(g0[m], g1[m], *data), 1),
                       "h2d_copy_call_us": round(overlap(g0[m], g1[m], *h2d), 1)}
    return {"gap_start": g0, "gap_end": g1, "cause": cause, "next_rows": next_rows, "idle_us": total,
            "refill_of": refill_of,
            "by_cause_us": {c: round(x, 1) for c, x in by.items() if x > 0},
            "share_pct": {c: round(100 * x / total, 1) for c, x in by.items() if x > 0 and total},
            "fill_us": fill, "end_of_step_us": round(float(length[_end_of_step(g0, g1, windows)].sum()), 1)}


def _refills(v: RankView, k: dict, g0: np.ndarray, g1: np.ndarray, cause: np.ndarray,
             syncs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Turn the launch-starvation gaps that refill a drained queue into ``sync_refill`` (in place on
    ``cause``); per gap, the index of the drain gap it refills (-1 for none). See the module's doc."""
    refill_of = np.full(len(g0), -1, dtype=np.int64)
    drains = np.flatnonzero(np.isin(cause, [CAUSES.index("sync_drain"), CAUSES.index("framework_sync")]))
    if not len(drains) or not len(syncs[0]):
        return refill_of
    cs, ce = syncs
    j = np.maximum(np.searchsorted(cs, g0[drains], "right") - 1, 0)
    wait = g0[drains] - cs[j]   # the GPU work queued when the sync began (us): the lead it threw away
    returned = ce[j]
    drains, wait, returned = drains[wait >= REFILL_MIN_WAIT_US], wait[wait >= REFILL_MIN_WAIT_US], \
        returned[wait >= REFILL_MIN_WAIT_US]
    if not len(drains):
        return refill_of
    # launches that returned with the GPU busy for REFILL_LEAD_US more at least: the CPU is ahead again
    p = launch_pairs(v)
    call_end = np.sort((v.ev.ts[p["cpu_rows"]] - v.ts0) + np.maximum(v.ev.dur[p["cpu_rows"]], 0)).astype(np.float64)
    bs, be = merge_intervals(k["ts"], k["end"])
    b = np.searchsorted(bs, call_end, "right") - 1
    busy = (b >= 0) & (be[np.maximum(b, 0)] - call_end >= REFILL_LEAD_US)
    queued = call_end[busy]
    q = np.searchsorted(queued, returned, "right")
    refilled = np.full(len(returned), np.inf)   # never refilled: the refill runs until the next drain
    hit = q < len(queued)
    refilled[hit] = queued[q[hit]]
    starved = np.flatnonzero(cause == CAUSES.index("launch_starvation"))
    d = np.searchsorted(g0[drains], g0[starved], "right") - 1   # the latest drain before each gap
    ok = (d >= 0) & (g0[starved] < refilled[np.maximum(d, 0)])
    starved, d = starved[ok], d[ok]
    # within one drain's refill, gaps count while the idle before them is under the lead it threw away
    length = g1[starved] - g0[starved]
    run = np.cumsum(length)
    first = np.concatenate(([True], d[1:] != d[:-1])) if len(d) else np.zeros(0, bool)
    before = run - length - np.repeat((run - length)[first], np.diff(np.concatenate((np.flatnonzero(first), [len(d)]))))
    keep = before < wait[d]
    cause[starved[keep]] = CAUSES.index("sync_refill")
    refill_of[starved[keep]] = drains[d[keep]]
    return refill_of


def _end_of_step(g0: np.ndarray, g1: np.ndarray, windows: list) -> np.ndarray:
    """Gaps that begin in the last ``100 - END_OF_STEP_PCT`` % of a step or cross into the next step."""
    if not windows or not len(g0):
        return np.zeros(len(g0), dtype=bool)
    starts = np.array([w[1] for w in windows])
    ends = np.array([w[2] for w in windows])
    j = np.searchsorted(starts, g0, "right") - 1
    jm = np.maximum(j, 0)
    inside = (j >= 0) & (g0 < ends[jm])
    late = g0 >= starts[jm] + (ends[jm] - starts[jm]) * END_OF_STEP_PCT / 100
    crosses = (j + 1 < len(starts)) & (g1 > starts[np.minimum(j + 1, len(starts) - 1)])
    return inside & (late | crosses)


def where_in_step(t: float, windows: list) -> tuple[int, float | None]:
    """(step, position in it as % of the step) of a time (us); (-1, None) outside every step."""
    step = int(step_of(np.array([t]), windows)[0])
    for num, a, b in windows:
        if num == step and b > a:
            return step, round(100 * (t - a) / (b - a), 1)
    return step, None


def idle_cause_summary(att: dict, top: int = 4) -> list[list]:
    """[[label, us, % of idle], ...] biggest first, for a finding's ``where``."""
    rows = sorted(att["by_cause_us"].items(), key=lambda kv: -kv[1])[:top]
    return [[LABELS[c], us, att["share_pct"].get(c, 0.0)] for c, us in rows]
