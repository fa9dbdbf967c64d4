"""Frequent CUDA kernel sequences (HTA 0.5.0 ``get_frequent_cuda_kernel_sequences``).

For an operator name (a substring, as in HTA) the CPU events whose name contains it are the
candidates; only the shallowest ones in the call stacks (:mod:`~otel_gpu.trace.call_stack`)
that launch at least ``min_pattern_len`` kernels are kept, so that nested matches are not
counted twice. Each kept event gives a pattern: its name, then the names of every kernel
launched beneath it (in the backward thread too, once linked under the main thread) in start
order. Per pattern: how often it occurs, the total GPU time of those kernels and the total
duration of the CPU events (us). Sorted by count (descending), then pattern.
"""
from __future__ import annotations

import numpy as np

from .call_stack import CallStacks
from .model import RankView

SEPARATOR = "|"  # HTA joins the names of a pattern with it


def frequent_sequences(v: RankView, cs: CallStacks, operator: str, min_pattern_len: int = 3) -> tuple[list[dict], str | None]:
    """(rows, reason) for one rank: rows (rank, operator, pattern, kernels, count,
    gpu_kernel_duration_us, cpu_op_duration_us) in HTA's order, or [] and why there are none."""
    ev = v.ev
    ids = np.array([i for i, s in enumerate(ev.names) if operator in s], dtype=np.int64)
    rows = v.rows[np.isin(ev.name[v.rows], ids)] if len(ids) else v.rows[:0]
    if not operator or not len(rows):
        return [], f"no event named like {operator!r}"
    dur = np.rint(ev.dur).astype(np.int64)
    min_depth = int(cs.depth[rows].min())
    if min_depth < 0:  # HTA's shallowest match is then outside the stacks: it finds no root
        return [], f"the shallowest events named like {operator!r} are not in a CPU call stack"
    # each kernel's ancestor at min_depth (none when it sits higher)
    k = cs.kernels
    anc = k.copy()
    kd = cs.depth[k]
    live = np.flatnonzero(kd > min_depth)
    while len(live):
        anc[live] = cs.parent[anc[live]]
        live = live[cs.depth[anc[live]] > min_depth]
    k_at = kd >= min_depth
    k, anc = k[k_at], anc[k_at]
    # candidate events at min_depth with their kernels
    cand = np.unique(rows[cs.depth[rows] == min_depth])
    is_kernel = np.isin(cand, cs.kernels)
    nk = np.zeros(len(cand), np.int64)
    j = np.searchsorted(cand, anc)
    j = np.minimum(j, len(cand) - 1)
    mine = cand[j] == anc
    np.add.at(nk, j[mine], 1)
    nk[is_kernel] = 1  # a kernel counts itself (HTA's num_kernels of a kernel row)
    keep = nk >= min_pattern_len
    if not keep.any():
        return [], f"no shallowest {operator!r} event launches {min_pattern_len} or more kernels"
    # the kernels of each kept candidate, in start order
    kk, kj = k[mine], j[mine]
    sel = keep[kj] & ~is_kernel[kj]
    kk, kj = kk[sel], kj[sel]
    o = np.lexsort((ev.index[kk], ev.ts[kk], kj))
    kk, kj = kk[o], kj[o]
    bounds = np.searchsorted(kj, np.arange(len(cand) + 1))
    # how often each candidate appears among the rows (a GPU row repeated by HTA's merge counts each time)
    times = np.bincount(np.searchsorted(cand, rows[cs.depth[rows] == min_depth]), minlength=len(cand))
    names = ev.names
    kname = ev.name[kk].tolist()
    kdur = np.cumsum(np.concatenate(([0], dur[kk])))
    agg: dict[tuple, list[int]] = {}
    for c in np.flatnonzero(keep).tolist():
        e = int(cand[c])
        if is_kernel[c]:
            pat, gpu = (int(ev.name[e]), int(ev.name[e])), int(dur[e])
        else:
            a, b = bounds[c], bounds[c + 1]
            pat, gpu = (int(ev.name[e]), *kname[a:b]), int(kdur[b] - kdur[a])
        acc = agg.setdefault(pat, [0, 0, 0])
        n = int(times[c])
        acc[0] += n
        acc[1] += n * gpu
        acc[2] += n * int(dur[e])
    out = [{"rank": v.rank, "operator": operator, "pattern": SEPARATOR.join(names[i] for i in pat),
            "kernels": len(pat) - 1, "count": c, "gpu_kernel_duration_us": g, "cpu_op_duration_us": d}
           for pat, (c, g, d) in agg.items()]
    out.sort(key=lambda r: (-r["count"], r["pattern"]))
    return out, None


def pool_ranks(rows: list[dict]) -> list[dict]:
    """Patterns summed over ranks (count and durations, us), with the ranks they occur on;
    sorted by operator, then count (descending), then pattern."""
    acc: dict[tuple[str, str], dict] = {}
    for r in rows:
        a = acc.setdefault((r["operator"], r["pattern"]), {
            "operator": r["operator"], "pattern": r["pattern"], "kernels": r["kernels"], "count": 0,
            "gpu_kernel_duration_us": 0, "cpu_op_duration_us": 0, "ranks": []})
        a["count"] += r["count"]
        a["gpu_kernel_duration_us"] += r["gpu_kernel_duration_us"]
        a["cpu_op_duration_us"] += r["cpu_op_duration_us"]
        a["ranks"].append(r["rank"])
    return sorted(acc.values(), key=lambda a: (a["operator"], -a["count"], a["pattern"]))
