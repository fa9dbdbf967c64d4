"""GPU idle time per stream, split into host wait, kernel wait and other (HTA 0.5.0 semantics).

Between consecutive kernels of one stream (sorted by start) the gap is *host wait* when the
launching runtime call started after the previous kernel ended, *kernel wait* when the gap is
under ``consecutive_kernel_delay`` us, else *other*. Times in microseconds.
"""
from __future__ import annotations

import numpy as np

from .describe import describe
from .model import RankView, id_in

KERNEL_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")
CATEGORIES = ("host_wait", "kernel_wait", "other")


def runtime_ts(v: RankView, rows: np.ndarray) -> np.ndarray:
    """Start (us) of each row's correlated event among the kept rows, NaN when absent.

    Follows HTA's join on index_correlation, including its quirk that an unmatched kernel
    (index_correlation 0) picks up the event at file position 0 when that one is kept.
    """
    ev = v.ev
    ic = v.index_correlation[rows]
    kept = np.zeros(len(ev), dtype=bool)
    kept[v.rows] = True
    pos = np.searchsorted(ev.index, ic)
    pos[pos >= len(ev.index)] = 0
    ok = (ic >= 0) & (ev.index[pos] == ic) & kept[pos] if len(ev.index) else np.zeros(len(ic), bool)
    out = np.full(len(rows), np.nan)
    out[ok] = ev.ts[pos[ok]] - v.ts0
    return out


def _describe(x: np.ndarray) -> dict:
    return describe(x[~np.isnan(x)])


def idle_time_breakdown(v: RankView, consecutive_kernel_delay: float = 30,
                        streams: list[int] | None = None) -> tuple[list[dict], list[dict]]:
    """(idle time per stream and category with ratio, interval statistics per stream and category)."""
    ev = v.ev
    cat_ids = v.symbol_ids(KERNEL_CATS)
    rows = v.rows[(ev.stream[v.rows] != -1) & id_in(ev, ev.cat[v.rows], cat_ids)]
    if streams is None or len(streams) == 0:
        _, first = np.unique(ev.stream[rows], return_index=True)
        streams = ev.stream[rows][np.sort(first)].tolist()
    runtime = runtime_ts(v, rows)
    breakdown: list[dict] = []
    stats: list[dict] = []
    for stream in streams:
        m = ev.stream[rows] == stream
        r = rows[m]
        ts = ev.ts[r] - v.ts0
        order = ts.argsort(kind="quicksort")
        r, ts, rt = r[order], ts[order], runtime[m][order]
        end = ts + ev.dur[r]
        prev_end = np.concatenate(([np.nan], end[:-1]))
        gap = ts - prev_end
        with np.errstate(invalid="ignore"):
            host = rt > prev_end
            kern = ~host & (gap < consecutive_kernel_delay)
        cat = np.where(host, 0, np.where(kern, 1, 2))
        present = [c for c in range(3) if (cat == c).any()]
        sums = {c: float(np.nansum(gap[cat == c])) for c in present}
        total = sum(sums.values())
        for c in present:
            ratio = sums[c] / total if total else float("nan")
            breakdown.append({"rank": v.rank, "stream": int(stream), "idle_category": CATEGORIES[c],
                              "idle_time": round(sums[c], 2), "idle_time_ratio": _round2(ratio)})
            st = _describe(gap[cat == c])
            stats.append({"idle_category": CATEGORIES[c], "rank": v.rank, "stream": int(stream),
                          **dict(zip(st, np.round(np.array(list(st.values()), dtype=np.float64), 2).tolist()))})
    return breakdown, stats


def _round2(x: float) -> float:
    return float(np.round(x, 2))
