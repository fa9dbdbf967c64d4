"""Temporal breakdown, GPU kernel breakdown and communication/computation overlap (HTA 0.5.0 semantics).

Pure functions of a :class:`~otel_gpu.trace.model.RankView`; times in microseconds. "GPU kernels"
here are HTA's: every kept event whose stream is not -1.
"""
from __future__ import annotations

import numpy as np

from .describe import quantiles
from .model import COMMUNICATION, COMPUTATION, MEMORY, RankView


def sort_desc(values: np.ndarray) -> np.ndarray:
    """Indexer of pandas' ``sort_values(ascending=False)`` (same tie order)."""
    n = len(values)
    idx = np.arange(n)[::-1]
    return idx[values[::-1].argsort(kind="quicksort")][::-1]


def merge_intervals(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [ts, end) intervals as sorted disjoint (starts, ends); touching intervals merge."""
    if len(ts) == 0:
        return ts[:0], end[:0].astype(np.float64)
    order = ts.argsort(kind="quicksort")
    s, e = ts[order], end[order]
    cm = np.maximum.accumulate(e)
    first = np.concatenate(([True], s[1:] > cm[:-1]))
    starts = np.flatnonzero(first)
    return s[starts], np.maximum.reduceat(e, starts)


def gpu_kernels(v: RankView) -> dict[str, np.ndarray]:
    """Rows with stream != -1: ts, end, dur, name id, stream, type (object array)."""
    rows = v.rows[v.ev.stream[v.rows] != -1]
    ts = v.ev.ts[rows] - v.ts0
    dur = v.ev.dur[rows]
    name = v.ev.name[rows]
    return {"rows": rows, "ts": ts, "dur": dur, "end": ts + dur, "name": name,
            "stream": v.ev.stream[rows], "type": v.type_of_rows(name)}


def _union_len(ts: np.ndarray, end: np.ndarray) -> float:
    s, e = merge_intervals(ts, end)
    return float(e.sum() - s.sum())


def temporal_breakdown(v: RankView) -> dict | None:
    """Idle / compute / non-compute time (us) and shares (%) of the span from first kernel
    start to last kernel end; None without GPU kernels."""
    k = gpu_kernels(v)
    if len(k["ts"]) == 0:
        return None
    s, e = merge_intervals(k["ts"], k["end"])
    kernel_time = float(e[-1] - s[0])
    idle = kernel_time - float(e.sum() - s.sum())
    comp = k["type"] == COMPUTATION
    compute = _union_len(k["ts"][comp], k["end"][comp])
    non_compute = kernel_time - compute - idle

    def pct(x: float) -> float:
        return float(np.round(100 * (x / kernel_time), 2)) if kernel_time else float("nan")
    return {"rank": v.rank, "idle_time_us": idle, "compute_time_us": compute,
            "non_compute_time_us": non_compute, "kernel_time_us": kernel_time,
            "idle_time_pctg": pct(idle), "compute_time_pctg": pct(compute),
            "non_compute_time_pctg": pct(non_compute)}


TYPES_ANALYSED = (COMPUTATION, COMMUNICATION, MEMORY)


def _type_overlap_time(k: dict) -> dict[str, float]:
    """Time (us) per kernel-type combination ("A overlapping B"), as HTA sweeps it."""
    times = np.zeros(0, dtype=np.float64)
    status = np.zeros(0, dtype=np.int64)
    for bit, t in enumerate(TYPES_ANALYSED):
        m = k["type"] == t
        s, e = merge_intervals(k["ts"][m], k["end"][m])
        value = 1 << bit
        times = np.concatenate([times, s.astype(np.float64), e.astype(np.float64)])
        status = np.concatenate([status, np.full(len(s), value), np.full(len(e), -value)])
        order = times.argsort(kind="quicksort")
        times, status = times[order], status[order]
    if len(times) == 0:
        return {}
    running = np.cumsum(status)
    nxt = np.concatenate((times[1:], [np.nan]))
    keep = (running > 0) & ~np.isnan(nxt)  # an interval still open at the end (negative durations) has no length
    dur = (nxt[keep] - times[keep]).astype(np.int64)
    values, inv = np.unique(running[keep], return_inverse=True)
    sums = np.bincount(inv, weights=dur, minlength=len(values))
    out: dict[str, float] = {}
    for r, d in zip(values.tolist(), sums.tolist()):
        label = " overlapping ".join(t for bit, t in enumerate(TYPES_ANALYSED) if r & (1 << bit))
        out[label] = out.get(label, 0) + d
    return out


def group_stats(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per distinct key: (keys, count, sum, max, min, mean, sample std with 0 for one value)."""
    order = np.argsort(keys, kind="stable")
    k, v = keys[order], values[order].astype(np.float64)
    starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    counts = np.diff(np.concatenate((starts, [len(k)])))
    sums = np.add.reduceat(v, starts)
    means = sums / counts
    sq = np.add.reduceat((v - np.repeat(means, counts)) ** 2, starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.where(counts > 1, np.sqrt(sq / np.maximum(counts - 1, 1)), 0.0)
    return (k[starts], counts, sums, np.maximum.reduceat(v, starts), np.minimum.reduceat(v, starts), means, std)


def aggregate_by_name(names: list[str], name_ids: np.ndarray, durs: np.ndarray, num_kernels: int,
               duration_ratio: float) -> list[dict]:
    """HTA's per-name aggregation with the tail folded into "others".

    ``sum``, ``max``, ``min``, ``mean``, ``std`` are HTA's columns: statistics over kernel instances
    while no name is folded, but once the table is folded (more than ``num_kernels`` names) over the
    per-name *sums* of each row's names (a kept name's max = min = mean = its sum). ``kernels``,
    ``kernel_mean``, ``kernel_max``, ``kernel_min`` are always over the row's kernel instances (us)."""
    if len(name_ids) == 0:
        return []
    ids, counts, sums, maxs, mins, means, stds = group_stats(name_ids, durs)
    stats = sorted(zip((names[i] for i in ids.tolist()), sums.tolist(), maxs.tolist(), mins.tolist(),
                       means.tolist(), stds.tolist(), counts.tolist()))
    sums = np.array([s[1] for s in stats])
    order = sort_desc(sums)
    stats = [stats[i] for i in order]
    if len(stats) <= num_kernels:
        return [{**dict(zip(("name", "sum", "max", "min", "mean", "std"), s[:6])), **_instances([s])} for s in stats]
    cums = np.cumsum([s[1] for s in stats])
    q = quantiles(cums, np.array([duration_ratio], dtype=np.float64))[0]   # np.quantile's value, bit for bit
    groups: dict[str, list[tuple]] = {}
    for pos, s in enumerate(stats):
        name = "others" if (cums[pos] > q or pos >= num_kernels) else s[0]
        groups.setdefault(name, []).append(s)
    out = []
    for name in sorted(groups):
        d = np.array([s[1] for s in groups[name]])
        out.append({"name": name, "sum": float(d.sum()), "max": float(d.max()), "min": float(d.min()),
                    "mean": float(d.mean()), "std": float(d.std(ddof=1)) if len(d) > 1 else 0.0,
                    **_instances(groups[name])})   # Python floats: the CSV writer's fast path
    return out


def _instances(stats: list[tuple]) -> dict:
    """Instance statistics (count, mean, max, min; us) of the kernels behind one or more names."""
    n = sum(s[6] for s in stats)
    return {"kernels": int(n), "kernel_mean": sum(s[1] for s in stats) / n if n else float("nan"),
            "kernel_max": max(s[2] for s in stats), "kernel_min": min(s[3] for s in stats)}


def rank_kernel_breakdown(v: RankView, num_kernels: int = 10, duration_ratio: float = 0.8,
                          include_memory: bool = True) -> tuple[dict[str, float], list[dict]]:
    """One rank's part of ``kernel_breakdown``: (GPU time per kernel type label, top kernels per type)."""
    types = TYPES_ANALYSED if include_memory else TYPES_ANALYSED[:2]
    k = gpu_kernels(v)
    if not include_memory:
        keep = k["type"] != MEMORY
        k = {key: val[keep] for key, val in k.items()}
    kernels: list[dict] = []
    for t in types:
        m = k["type"] == t
        for row in aggregate_by_name(v.names, k["name"][m], k["dur"][m], num_kernels, duration_ratio):
            row.update(kernel_type=t, rank=v.rank)
            kernels.append(row)
    return _type_overlap_time(k), kernels


def combine_kernel_breakdowns(per_rank: list[tuple[dict[str, float], list[dict]]]) -> tuple[list[dict], list[dict]]:
    """The ranks' ``rank_kernel_breakdown`` results (in rank order) as ``kernel_breakdown``'s tables."""
    by_type: dict[str, float] = {}
    kernels: list[dict] = []
    for times, rows in per_rank:
        for label, t in times.items():
            by_type[label] = by_type.get(label, 0) + t
        kernels += rows
    labels = sorted(by_type)
    sums = np.array([by_type[lb] for lb in labels], dtype=np.float64)
    total = sums.sum()
    type_rows = [{"kernel_type": labels[i], "sum": float(sums[i]),
                  "percentage": float(np.round(100 * sums[i] / total, 1)) if total else float("nan")}
                 for i in sort_desc(sums)]
    kernels.sort(key=lambda r: (r["kernel_type"], r["name"], r["rank"]))
    return type_rows, kernels


def kernel_breakdown(views: list[RankView], num_kernels: int = 10, duration_ratio: float = 0.8,
                     include_memory: bool = True) -> tuple[list[dict], list[dict]]:
    """(time per kernel type over all ranks with %, top kernels per rank and type)."""
    return combine_kernel_breakdowns([rank_kernel_breakdown(v, num_kernels, duration_ratio, include_memory)
                                      for v in views])


def comm_comp_overlap(v: RankView) -> dict:
    """Share (%) of communication-kernel time during which a computation kernel also runs."""
    k = gpu_kernels(v)
    comp = k["type"] == COMPUTATION
    comm = k["type"] == COMMUNICATION
    cs, ce = merge_intervals(k["ts"][comp], k["end"][comp])
    ms, me = merge_intervals(k["ts"][comm], k["end"][comm])
    times = np.concatenate([ms, me, cs, ce]).astype(np.float64)
    status = np.concatenate([np.ones(len(ms)), -np.ones(len(me)), np.full(len(cs), 2), np.full(len(ce), -2)])
    order = times.argsort(kind="quicksort")
    times, running = times[order], np.cumsum(status[order])
    both = np.flatnonzero(running[:-1] == 3)
    overlap = float((times[both + 1] - times[both]).sum())
    comm_time = float((me - ms).sum())
    ratio = overlap / comm_time if comm_time else float("nan")
    return {"rank": v.rank, "comm_time_us": comm_time, "overlap_time_us": overlap,
            "comp_comm_overlap_pctg": float(np.round(100 * ratio, 2))}
