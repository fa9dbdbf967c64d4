"""ProfilerStep windows and the cross-rank summary: load imbalance and stragglers.

A step's time on a rank is the duration (us) of its CPU ``ProfilerStep#N`` annotation. For
each step seen on two or more ranks the straggler is the slowest rank; ``excess_us`` is its
time minus the median over ranks, ``imbalance_pct`` is 100 * (max - mean) / mean. GPU-side,
per-rank computation time (us, from the temporal breakdown) shows which rank computes most.
"""
from __future__ import annotations

import re

import numpy as np

from .breakdown import gpu_kernels, merge_intervals
from .idle import runtime_ts
from .median import median
from .model import COMMUNICATION, SYNC_EVENT_NAMES, RankView, id_in

_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")


def step_windows(v: RankView, all_events: bool = True) -> list[tuple[int, float, float]]:
    """(step number, start us, end us) of the CPU ProfilerStep annotations, by start; without
    the last one when HTA's rule dropped its events (computed once per rank: the caller must not
    modify the list)."""
    return v.cached(f"step_windows {all_events}", lambda: _step_windows(v, all_events))


def _step_windows(v: RankView, all_events: bool) -> list[tuple[int, float, float]]:
    ev = v.ev
    ids = {i: int(m.group(1)) for i, n in enumerate(ev.names) if (m := _STEP_RE.match(n))}
    if not ids:
        return []
    rows = np.arange(len(ev)) if all_events else v.rows
    is_gpu = (ev.stream[rows] >= 0) & (ev.correlation[rows] >= 0)
    cpu_cat_gpu = id_in(ev, ev.cat[rows], [i for i, n in enumerate(ev.names) if n == "gpu_user_annotation"])
    sync = id_in(ev, ev.name[rows], [i for i, n in enumerate(ev.names) if n in SYNC_EVENT_NAMES])
    rows = rows[id_in(ev, ev.name[rows], list(ids)) & ~is_gpu & ~cpu_cat_gpu & ~sync]
    out = {}
    for r in rows.tolist():
        step = ids[int(ev.name[r])]
        start = float(ev.ts[r] - v.ts0)
        if step not in out or start < out[step][1]:
            out[step] = (step, start, start + float(ev.dur[r]))
    wins = sorted(out.values(), key=lambda w: w[1])
    return wins[:-1] if v.last_step_dropped and wins else wins


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


_COMM_OP_RE = re.compile(r"^(gloo:|nccl:|c10d::|record_param_comms)|all_?reduce|all_?gather|reduce_?scatter"
                         r"|alltoall|all_to_all|broadcast", re.IGNORECASE)


def comm_time_per_step(v: RankView, windows: list[tuple[int, float, float]]) -> dict[int, float]:
    """Time (us) spent in communication per step: the union of NCCL kernels launched in the step,
    or on CPU-only traces the union of collective CPU ops (gloo/nccl/c10d) inside the step window."""
    out = {w[0]: 0.0 for w in windows}
    if not windows:
        return out
    k = gpu_kernels(v)
    comm = k["type"] == COMMUNICATION
    if comm.any():
        ts, end = k["ts"][comm], k["end"][comm]
        rt = runtime_ts(v, k["rows"][comm])
        step = step_of(np.where(np.isnan(rt), ts, rt).astype(np.float64), windows)
        for s_ in out:
            m = step == s_
            a, b = merge_intervals(ts[m], end[m])
            out[s_] = float((b - a).sum())
        return out
    ev = v.ev
    ids = [i for i, n in enumerate(ev.names) if _COMM_OP_RE.search(n)]
    rows = v.rows[id_in(ev, ev.name[v.rows], ids) & (ev.stream[v.rows] == -1)]
    ts = (ev.ts[rows] - v.ts0).astype(np.float64)
    end = ts + np.maximum(ev.dur[rows], 0)
    for num, w0, w1 in windows:
        a, b = merge_intervals(np.clip(ts, w0, w1), np.clip(end, w0, w1))
        out[num] = float((b - a).sum())
    return out


def rank_steps(v: RankView) -> dict[int, dict]:
    """One rank's steps: {step: {"step_us", "comm_us", "busy_us"}} (us)."""
    w = step_windows(v)
    comm = comm_time_per_step(v, w)
    return {n: {"step_us": b - a, "comm_us": comm[n], "busy_us": max(0.0, (b - a) - comm[n])} for n, a, b in w}


def cross_rank_summary(ranks: list[int], temporal: list[dict], steps_of: list[dict]) -> dict:
    """Per-step times per rank and the straggler of each step.

    Ranks of a synchronous job finish a step together: the others wait for the slowest inside
    collectives. So the straggler of a step is the rank with the most *busy* time (step time
    minus communication time, us); ``excess_us`` is its busy time minus the median rank's and
    ``imbalance_pct`` is 100 * (max - mean) / mean of busy time. ``steps_of``: each rank's
    ``rank_steps`` (in ``ranks``' order).
    """
    per_rank: dict[int, dict[int, dict]] = dict(zip(ranks, steps_of))
    steps = sorted({s_ for d in per_rank.values() for s_ in d})
    rows = []
    for s_ in steps:
        cells = {r: d[s_] for r, d in per_rank.items() if s_ in d}
        busy = {r: c["busy_us"] for r, c in cells.items()}
        vals = np.array(list(busy.values()))
        strag = max(busy, key=lambda r: busy[r])
        slow = max(cells, key=lambda r: cells[r]["step_us"])
        med, mean = median(busy.values()), float(vals.mean())
        rows.append({"step": s_, "ranks": len(cells), "straggler_rank": strag, "straggler_busy_us": busy[strag],
                     "median_busy_us": med, "excess_us": busy[strag] - med,
                     "imbalance_pct": round(100 * (busy[strag] - mean) / mean, 2) if mean else 0.0,
                     "slowest_step_rank": slow, "slowest_step_us": cells[slow]["step_us"],
                     "per_rank": {str(r): c for r, c in sorted(cells.items())}})
    counts: dict[int, int] = {}
    for r in rows:
        if r["ranks"] > 1:
            counts[r["straggler_rank"]] = counts.get(r["straggler_rank"], 0) + 1
    summary: dict = {"ranks": list(ranks), "steps": rows,
                     "straggler_counts": {str(k): n for k, n in sorted(counts.items())}}
    if len(ranks) > 1 and rows:
        tot = {r: sum(c["busy_us"] for c in d.values()) for r, d in per_rank.items() if d}
        worst = max(tot, key=lambda r: tot[r])
        med = median(tot.values())
        summary["straggler"] = {"rank": worst, "busy_us": tot[worst], "median_busy_us": med,
                                "excess_us": tot[worst] - med,
                                "excess_pct": round(100 * (tot[worst] - med) / med, 2) if med else 0.0,
                                "steps_slowest": counts.get(worst, 0)}
    comp = {t["rank"]: t["compute_time_us"] for t in temporal if t}
    if len(comp) > 1:
        vals = np.array(list(comp.values()))
        top = max(comp, key=lambda r: comp[r])
        summary["compute_imbalance"] = {"max_rank": top, "max_us": comp[top], "mean_us": float(vals.mean()),
                                        "imbalance_pct": round(100 * (comp[top] - vals.mean()) / vals.mean(), 2)
                                        if vals.mean() else 0.0}
    return summary
