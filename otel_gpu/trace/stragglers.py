"""Potential stragglers by late-starting collectives (HTA 0.5.0 ``get_potential_stragglers``).

Ranks of a synchronous job meet in blocking collectives, so the rank that *starts* the dominant
collective last is the one the others wait for. Per rank and ProfilerStep, the last NCCL kernel
(``ncclKernel*``, stream > 0, step > 0) of each stream and name lasting at least 1% of the mean
step time is kept; the (stream, kernel) whose duration varies most across ranks (mean over
steps of the standard deviation) is the candidate; each step flags the ranks whose candidate
kernel starts among the ``num_candidates`` latest; the ranks flagged most often are returned.
Times are normalized by the mean step time (the span of the selected steps / their number).
"""
from __future__ import annotations

import re

import numpy as np

from .breakdown import sort_desc
from .model import RankView, id_in

_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")


def event_iterations(v: RankView) -> np.ndarray:
    """ProfilerStep number of every event of ``v.ev`` as HTA assigns it at load time.

    CPU events (stream < 0): the step whose CPU-time window holds the start (the last such step
    in file order when several do), else -1; GPU events (stream > 0): the step of the correlated
    CPU event, -1 without one; stream 0: -2 (HTA leaves it undetermined).
    """
    ev = v.ev
    out = np.full(len(ev), -2, dtype=np.int64)
    steps = {i: int(m.group(1)) for i, n in enumerate(ev.names)
             if n.startswith("ProfilerStep") and (m := _STEP_RE.match(n))}
    cpu = np.flatnonzero(ev.stream < 0)
    ts = ev.ts[cpu]
    it = np.full(len(cpu), -1, dtype=np.int64)
    for r in np.flatnonzero(np.isin(ev.name, list(steps))).tolist():
        start = ev.ts[r]
        it[(ts >= start) & (ts < start + ev.dur[r])] = steps[int(ev.name[r])]
    out[cpu] = it
    gpu = np.flatnonzero(ev.stream > 0)
    ic = v.index_correlation[gpu]
    pos = np.minimum(np.searchsorted(ev.index, ic), max(len(ev) - 1, 0))
    ok = (ic > 0) & (ev.index[pos] == ic) if len(ev) else np.zeros(len(gpu), bool)
    out[gpu] = np.where(ok, out[pos], -1)
    return out


def _k_largest(values: np.ndarray, k: int) -> float | None:
    return float(np.sort(values)[::-1][k - 1]) if len(values) >= k else None


def rank_part(v: RankView) -> tuple:
    """What ``combine`` needs of one rank: (rank, step numbers of its ProfilerStep rows, {step:
    (first start, last end)} of its rows (us from the set's start), its NCCL kernel rows (stream,
    step, name, ts, dur) in HTA's row order)."""
    ev, r = v.ev, v.rows
    it = event_iterations(v)[r]
    step_ids = [i for i, n in enumerate(ev.names) if n.startswith("ProfilerStep") and _STEP_RE.match(n)]
    step_its = it[id_in(ev, ev.name[r], step_ids)]
    t = (ev.ts[r] - v.ts0).astype(np.float64)
    d = ev.dur[r]
    spans: dict[int, tuple[float, float]] = {}
    for x in np.unique(it).tolist():
        m = it == x
        spans[x] = (float(t[m].min()), float((t[m] + d[m]).max()))
    comm_ids = [i for i, n in enumerate(ev.names) if n.startswith("ncclKernel")]
    c = np.flatnonzero((ev.stream[r] > 0) & (it > 0) & id_in(ev, ev.name[r], comm_ids))
    names = ev.names
    return (v.rank, set(step_its[step_its != -1].tolist()), spans,
            (ev.stream[r][c], it[c], [names[i] for i in ev.name[r][c].tolist()], t[c], d[c]))


def potential_stragglers(views: list[RankView], num_candidates: int = 2,
                         min_normalized_duration: float = 0.01) -> dict:
    """``{"ranks": [...], "counts": {rank: steps flagged}, "kernel", "stream", "error"}``;
    ``error`` says why there is no answer (HTA raises in those cases)."""
    return combine([rank_part(v) for v in views], num_candidates, min_normalized_duration)


def combine(parts: list[tuple], num_candidates: int = 2, min_normalized_duration: float = 0.01) -> dict:
    """``potential_stragglers`` from the ranks' ``rank_part`` results (in rank order)."""
    k = max(1, num_candidates)
    per_rank = []  # (rank, its NCCL kernel rows: stream, step, name, ts, dur) in HTA's row order
    spans: dict[int, tuple[float, float]] = {}  # step -> (first start, last end) over all ranks' rows
    available: set[int] = set()  # step numbers of the ProfilerStep rows kept
    for rank, steps, rank_spans, comm in parts:
        available.update(steps)
        for x, (lo, hi) in rank_spans.items():
            old = spans.get(x)
            spans[x] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        per_rank.append((rank, *comm))
    if not available:
        return {"ranks": [], "counts": {}, "error": "no ProfilerStep in the traces"}
    iters = sorted(x for x in spans if x in available and x != -1)
    t_min = min(spans[x][0] for x in spans if x in available)
    t_max = max(spans[x][1] for x in spans if x in available)
    mean_iter = (t_max - t_min) / len(iters)
    min_dur = mean_iter * min_normalized_duration
    wanted = sorted(available)
    last: dict[tuple, tuple[float, float]] = {}  # (rank, stream, iteration, name) -> (ts, dur) of the last row
    for rank, s_, it, n, t, d in per_rank:
        for j in np.flatnonzero(np.isin(it, wanted) & (d >= min_dur)).tolist():
            last[(rank, int(s_[j]), int(it[j]), n[j])] = (float(t[j]), float(d[j]))
    if not last:
        return {"ranks": [], "counts": {}, "error": "no NCCL kernel lasting 1% of a step"}
    keys = sorted(last)
    spread: dict[tuple, list[float]] = {}
    by_step: dict[tuple, list[float]] = {}
    for rank, s, it, name in keys:
        by_step.setdefault((s, it, name), []).append(last[(rank, s, it, name)][1] / mean_iter)
    for (s, it, name), durs in by_step.items():
        if len(durs) > 1:
            spread.setdefault((s, name), []).append(float(np.std(durs, ddof=1)))
    if not spread:
        return {"ranks": [], "counts": {}, "error": "no NCCL kernel seen on two or more ranks"}
    best = max(sorted(spread), key=lambda sn: float(np.mean(spread[sn])))  # first of equal maxima, as idxmax
    cand = [(rank, it, (last[(rank, s, it, name)][0] - t_min) / mean_iter)
            for rank, s, it, name in keys if (s, name) == best]
    counts: dict[int, int] = {}
    if len({it for _, it, _ in cand}) == 1:
        threshold = _k_largest(np.array([c[2] for c in cand]), k)
        if threshold is None:
            return {"ranks": [], "counts": {}, "error": f"fewer than {k} ranks run the candidate kernel"}
        for rank, _, x in cand:
            counts[rank] = int(x >= threshold)
    else:
        for rank, _, _ in cand:
            counts.setdefault(rank, 0)
        for it in sorted({c[1] for c in cand}):
            group = [c for c in cand if c[1] == it]
            if it < 0:
                continue
            threshold = _k_largest(np.array([c[2] for c in group]), k)
            if threshold is None:
                return {"ranks": [], "counts": {},
                        "error": f"fewer than {k} ranks run the candidate kernel in step {it}"}
            for rank, _, x in group:
                counts[rank] += int(x >= threshold)
        counts = dict(sorted(counts.items()))
    ranks = list(counts)
    order = sort_desc(np.array([counts[r] for r in ranks]))
    return {"ranks": [ranks[i] for i in order[:k]], "counts": counts, "stream": best[0], "kernel": best[1],
            "steps": iters, "error": None}
