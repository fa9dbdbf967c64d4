"""Launch-queue length and memory-copy bandwidth per rank (HTA 0.5.0 ``TraceCounters`` semantics).

**Queue length** of a stream: +1 when a launch call (``cudaLaunchKernel``, ``cudaLaunchKernelExC``,
``cuLaunchKernel``, ``cudaMemcpyAsync``, ``cudaMemsetAsync`` and their HIP forms) whose GPU event
is kept enqueues work, -1 when that GPU event starts; the series is summarised per stream
(count, mean, std, quartiles of the values it takes). **Blocked on a full queue**: time (us)
during which a stream's queue holds ``max_queue_length`` (1024, CUDA's limit) or more.
**Memory bandwidth** (GB/s): per copy kind (``Memcpy HtoD``, ``Memcpy DtoH``, ``Memcpy DtoD``,
``Memset``, ...), the sum of the bandwidths of the copies running at each change point,
summarised over the points where it is above 0.
"""
from __future__ import annotations

import numpy as np

from .breakdown import gpu_kernels
from .describe import describe
from .model import MEMORY, RankView, id_in

LAUNCH_CALLS = ("cudaMemsetAsync", "cudaMemcpyAsync", "cudaLaunchKernel", "cudaLaunchKernelExC",
                "cuLaunchKernel", "runFunction - job_prep_and_submit_for_execution", "hipLaunchKernel",
                "hipExtModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpyWithStream")
CUDA_MAX_LAUNCH_QUEUE = 1024


def queue_length_series(v: RankView) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """stream -> (ts us, queue length after each change), in HTA's event order."""
    return {s: (ts, q) for s, (ts, q, _) in _queue_changes(v).items()}


def queue_length_at_events(v: RankView) -> dict[int, int]:
    """Event index (a launch call or its GPU event) -> the stream's queue length just after it."""
    out: dict[int, int] = {}
    for _, q, rows in _queue_changes(v).values():
        out.update(zip(v.ev.index[rows].tolist(), q.tolist()))
    return out


def queue_length_at(v: RankView, indices: np.ndarray) -> np.ndarray:
    """The queue length just after each event of ``indices`` (event indexes, see ``RankEvents.index``)
    that changes a queue, as ``queue_length_at_events`` gives it (an event in several changes: the
    last one's), in ``indices``' order; events that change no queue are left out."""
    changes = list(_queue_changes(v).values())
    keys = v.ev.index[np.concatenate([rows for _, _, rows in changes])] if changes else np.zeros(0, np.int64)
    if not len(keys) or not len(indices):
        return np.zeros(0, dtype=np.int64)
    values = np.concatenate([q for _, q, _ in changes])
    uniq, last = np.unique(keys[::-1], return_index=True)   # the last change of each event
    j = np.minimum(np.searchsorted(uniq, indices), len(uniq) - 1)
    found = uniq[j] == indices
    return values[::-1][last[j[found]]]


def _queue_changes(v: RankView) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """stream -> (ts us, queue length after each change, the event (row of ``ev``) of each change);
    computed once per rank for the summary, the full-queue time, the series and the findings."""
    return v.cached("queue_changes", lambda: _compute_queue_changes(v))


def _compute_queue_changes(v: RankView) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    ev, rows = v.ev, v.rows
    calls = rows[id_in(ev, ev.name[rows], v.symbol_ids(LAUNCH_CALLS)) & (v.index_correlation[rows] > 0)]
    gpu = rows[ev.stream[rows] != -1]
    # left join of the calls on the GPU events by correlation (a call can match several GPU rows)
    gcorr = ev.correlation[gpu]
    order = np.argsort(gcorr, kind="stable")
    sc = gcorr[order]
    ccorr = ev.correlation[calls]
    lo, hi = np.searchsorted(sc, ccorr, "left"), np.searchsorted(sc, ccorr, "right")
    n = np.maximum(hi - lo, 1)
    call_rows = np.repeat(calls, n)
    first = np.repeat(np.cumsum(n) - n, n)
    k = np.arange(len(call_rows)) - first
    matched = np.repeat(hi > lo, n)
    call_stream = np.full(len(call_rows), -1, dtype=np.int64)  # -1: no GPU event (NaN in HTA)
    call_stream[matched] = ev.stream[gpu[order[(np.repeat(lo, n) + k)[matched]]]]
    gpu_kept = gpu[np.isin(gcorr, ccorr)]
    all_rows = np.concatenate([call_rows, gpu_kept])
    step = np.concatenate([np.ones(len(call_rows), np.int64), -np.ones(len(gpu_kept), np.int64)])
    stream = np.concatenate([call_stream, ev.stream[gpu_kept]])
    ts = ev.ts[all_rows] - v.ts0
    srt = ts.argsort(kind="quicksort")  # as pandas sort_values(by="ts"): same tie order as HTA
    ts, step, stream, all_rows = ts[srt], step[srt], stream[srt], all_rows[srt]
    out = {}
    for s in np.unique(stream[stream != -1]).tolist():
        m = stream == s
        out[s] = (ts[m], np.cumsum(step[m]), all_rows[m])
    return out


def queue_length_summary(v: RankView) -> list[dict]:
    """Per stream: statistics of the queue length values (HTA ``get_queue_length_summary``)."""
    return [{"rank": v.rank, "stream": s, **describe(q.astype(np.float64))}
            for s, (_, q) in queue_length_series(v).items()]


def blocked_on_full_queue(v: RankView, max_queue_length: int = CUDA_MAX_LAUNCH_QUEUE) -> list[dict]:
    """Time (us) a stream's queue held ``max_queue_length`` or more, and its share of the rank's
    trace duration. As HTA, one row per rank: the last stream (by number) that was ever full."""
    series = queue_length_series(v)
    ts_all = v.ev.ts[v.rows]
    span = float(ts_all.max() - ts_all.min()) if len(ts_all) else 0.0
    row = None
    for s, (ts, q) in series.items():
        full = q[:-1] >= max_queue_length
        if not (q >= max_queue_length).any():
            continue
        dur = float((np.diff(ts)[full]).sum())
        row = {"rank": v.rank, "stream": s, "duration_at_max_queue_length": dur,
               "relative_duration_at_max_queue_length": dur / span if span else float("nan")}
    return [row] if row else []


def memory_kind(name: str) -> str:
    """Copy kind of a memory event name: ``Memset``, ``Memcpy HtoD`` (first 11 characters), or
    ``Memcpy Unknown``."""
    if name[:6] == "Memset":
        return "Memset"
    if name[:6] != "Memcpy":
        return "Memcpy Unknown"
    return name[:11]


def memory_bw_series(v: RankView) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """copy kind -> (ts us, total GB/s of the copies of that kind running after each change);
    computed once per rank for the summary and the series."""
    return v.cached("memory_bw_series", lambda: _compute_memory_bw_series(v))


def _compute_memory_bw_series(v: RankView) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    k = gpu_kernels(v)
    mem = k["type"] == MEMORY
    if not mem.any():
        return {}
    rows = k["rows"][mem]
    kinds = np.array([memory_kind(v.names[n]) for n in k["name"][mem].tolist()], dtype=object)
    ts = k["ts"][mem]
    dur = np.where(k["dur"][mem] == 0, 1.0, k["dur"][mem])  # HTA: 0 us copies count as 1 us
    bw = v.ev.memory_bw(rows)
    all_ts = np.concatenate([ts.astype(np.float64), ts + dur])
    all_bw = np.concatenate([bw, -bw])
    all_kind = np.concatenate([kinds, kinds])
    if ts.dtype.kind == "i" and (dur == np.floor(dur)).all():
        all_ts = all_ts.astype(ts.dtype if ts.dtype.itemsize >= 8 else np.int64)
    srt = all_ts.argsort(kind="quicksort")
    all_ts, all_bw, all_kind = all_ts[srt], all_bw[srt], all_kind[srt]
    return {kind: (all_ts[all_kind == kind], np.cumsum(all_bw[all_kind == kind]))
            for kind in sorted(set(kinds.tolist()))}


def memory_bw_summary(v: RankView) -> list[dict]:
    """Per copy kind: statistics (GB/s) of the bandwidth series where it is above 0."""
    out = []
    for kind, (_, bw) in memory_bw_series(v).items():
        if (bw > 0).any():  # a kind whose copies carry no bandwidth gets no row, as in HTA
            out.append({"rank": v.rank, "name": kind, **describe(bw[bw > 0])})
    return out
