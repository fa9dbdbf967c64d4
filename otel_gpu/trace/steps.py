"""ProfilerStep windows and the cross-rank summary: load imbalance and stragglers.

A step's time on a rank is the duration (us) of its CPU ``ProfilerStep#N`` annotation. For
each step seen on two or more ranks the straggler is the slowest rank; ``excess_us`` is its
time minus the median over ranks, ``imbalance_pct`` is 100 * (max - mean) / mean. GPU-side,
per-rank computation time (us, from the temporal breakdown) shows which rank computes most.
"""
from __future__ import annotations

import re

import numpy as np

from .model import SYNC_EVENT_NAMES, RankView

_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")


def step_windows(v: RankView, all_events: bool = True) -> list[tuple[int, float, float]]:
    """(step number, start us, end us) of the CPU ProfilerStep annotations, by start."""
    ev = v.ev
    ids = {i: int(m.group(1)) for i, n in enumerate(ev.names) if (m := _STEP_RE.match(n))}
    if not ids:
        return []
    rows = np.arange(len(ev)) if all_events else v.rows
    is_gpu = (ev.stream[rows] >= 0) & (ev.correlation[rows] >= 0)
    cpu_cat_gpu = np.isin(ev.cat[rows], [i for i, n in enumerate(ev.names) if n == "gpu_user_annotation"])
    sync = np.isin(ev.name[rows], [i for i, n in enumerate(ev.names) if n in SYNC_EVENT_NAMES])
    rows = rows[np.isin(ev.name[rows], list(ids)) & ~is_gpu & ~cpu_cat_gpu & ~sync]
    out = {}
    for r in rows.tolist():
        step = ids[int(ev.name[r])]
        start = float(ev.ts[r] - v.ts0)
        if step not in out or start < out[step][1]:
            out[step] = (step, start, start + float(ev.dur[r]))
    return sorted(out.values(), key=lambda w: w[1])


def step_of(times: np.ndarray, windows: list[tuple[int, float, float]]) -> np.ndarray:
    """Step number of each time (us), -1 outside every step window."""
    out = np.full(len(times), -1, dtype=np.int64)
    if not windows:
        return out
    starts = np.array([w[1] for w in windows])
    ends = np.array([w[2] for w in windows])
    nums = np.array([w[0] for w in windows])
    j = np.searchsorted(starts, times, "right") - 1
    ok = (j >= 0)
    ok[ok] &= times[ok] < ends[j[ok]]
    out[ok] = nums[j[ok]]
    return out


def cross_rank_summary(views: list[RankView], temporal: list[dict]) -> dict:
    """Per-step times per rank, stragglers per step, and per-rank totals."""
    per_rank = {v.rank: {w[0]: w[2] - w[1] for w in step_windows(v)} for v in views}
    steps = sorted({s for d in per_rank.values() for s in d})
    rows = []
    for s in steps:
        times = {r: d[s] for r, d in per_rank.items() if s in d}
        if not times:
            continue
        vals = np.array(list(times.values()))
        slow = max(times, key=lambda r: times[r])
        fast = min(times, key=lambda r: times[r])
        mean = float(vals.mean())
        rows.append({"step": s, "ranks": len(times), "slowest_rank": slow, "slowest_us": times[slow],
                     "fastest_rank": fast, "fastest_us": times[fast], "median_us": float(np.median(vals)),
                     "excess_us": times[slow] - float(np.median(vals)),
                     "imbalance_pct": round(100 * (times[slow] - mean) / mean, 2) if mean else 0.0,
                     "per_rank_us": {str(r): t for r, t in sorted(times.items())}})
    stragglers: dict[int, int] = {}
    for r in rows:
        if r["ranks"] > 1:
            stragglers[r["slowest_rank"]] = stragglers.get(r["slowest_rank"], 0) + 1
    comp = {t["rank"]: t["compute_time_us"] for t in temporal if t}
    summary = {"ranks": [v.rank for v in views], "steps": rows,
               "straggler_counts": {str(k): n for k, n in sorted(stragglers.items())}}
    if len(views) > 1 and rows:
        mean_steps = {r: float(np.mean(list(d.values()))) for r, d in per_rank.items() if d}
        worst = max(mean_steps, key=lambda r: mean_steps[r])
        med = float(np.median(list(mean_steps.values())))
        summary["slowest_rank"] = {"rank": worst, "mean_step_us": mean_steps[worst], "median_mean_step_us": med,
                                   "excess_pct": round(100 * (mean_steps[worst] - med) / med, 2) if med else 0.0}
    if len(comp) > 1:
        vals = np.array(list(comp.values()))
        top = max(comp, key=lambda r: comp[r])
        summary["compute_imbalance"] = {"max_rank": top, "max_us": comp[top], "mean_us": float(vals.mean()),
                                        "imbalance_pct": round(100 * (comp[top] - vals.mean()) / vals.mean(), 2)
                                        if vals.mean() else 0.0}
    return summary
