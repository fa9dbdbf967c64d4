"""ATen ops, the kernels they launch and the delays on the way (HTA 0.5.0
``get_aten_op_kernels_and_delay``).

Each kernel launch call (``cuda*LaunchKernel*``, ``cuLaunchKernel``, ``runFunction*``) is
attributed to the deepest ``aten::`` op that wraps it (the latest-starting op whose
[start, end] contains the call). An op instance's kernels form its *kernel sequence*
("k1 -> k2"); per (op, sequence): how often it occurs, the mean *ATen op launch delay*
(op start to its first launch call, us) and the mean *runtime delay* (that call's start to its
kernel's start on the GPU, us).

Differences from HTA, on purpose: each rank's table holds that rank's ops only (HTA 0.5.0
carries the earlier ranks' launches into every later rank's table), and an op instance is
(name, start) rather than (thread, name, start) because thread ids are not kept in memory
(two ops of one name starting in the same microsecond on two threads count as one instance).
Launches whose kernel is missing from the kept events are skipped (HTA raises there).

The analysis groups op instances with array operations (``op_instances``); the row-per-launch
functions (``aten_op_launches``, ``aten_op_instances``, ``aten_op_kernels``) follow HTA's steps one
row at a time and are kept as the reference the tests compare with (and for HTA's carried-over
table in the parity tests).
"""
from __future__ import annotations

import math
import re
import sys

import numpy as np

from .breakdown import sort_desc
from .model import RankView, id_in

LAUNCH_RE = re.compile(r"(cuda.*LaunchKernel)|(cuLaunchKernel)|(^runFunction)")


def deepest_wrapping(op_ts: np.ndarray, op_end: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each call [start, end], the index (into ops sorted by start, ties in row order) of the
    latest-starting op with ts <= start and end >= the call's end, the first in row order among
    equal starts; -1 when none. Binary lifting over a sparse table of maxima of ``op_end``."""
    n = len(op_ts)
    pos = np.searchsorted(op_ts, starts, "right") - 1  # last op starting at or before the call
    if n == 0:
        return np.full(len(starts), -1, dtype=np.int64)
    prefix_max = np.maximum.accumulate(op_end)
    found = (pos >= 0) & (prefix_max[np.maximum(pos, 0)] >= ends)
    table = [op_end]  # table[k][i] = max(op_end[i : i + 2**k])
    while (1 << len(table)) <= n:
        prev, half = table[-1], 1 << (len(table) - 1)
        table.append(np.maximum(prev[:-half], prev[half:]))
    p = np.where(found, pos, 0)
    for k in range(len(table) - 1, -1, -1):  # skip whole blocks whose ops all end too early
        block_start = p - (1 << k) + 1
        ok = found & (block_start >= 0)
        idx = np.where(ok, block_start, 0)
        skip = ok & (table[k][np.minimum(idx, len(table[k]) - 1)] < ends) & (idx < len(table[k]))
        p = np.where(skip, p - (1 << k), p)
    out = np.where(found, p, -1)
    # equal starts: the first (in row order) wrapping op among them, as pandas' sort picks
    tied = np.flatnonzero(found & (p > 0))
    tied = tied[op_ts[p[tied] - 1] == op_ts[p[tied]]]
    for q in tied.tolist():
        j = out[q]
        i = j - 1
        while i >= 0 and op_ts[i] == op_ts[j]:
            if op_end[i] >= ends[q]:
                out[q] = i
            i -= 1
    return out


def _matches(v: RankView):
    """Each launch call matched to its op and kernels: (launches, op rows sorted by start, deepest
    wrapping op per launch (index into those ops, -1: none), the launch's first kept kernel as a
    position ``lo`` in the GPU rows ordered by index_correlation (its row: ``gpu[ic_order[lo]]``),
    kept kernels per launch, GPU rows, that order, launch starts); None without ops or launches."""
    ev, rows = v.ev, v.rows
    names = ev.names
    aten_ids = [i for i, n in enumerate(names) if n.startswith("aten::")]
    launch_ids = [i for i, n in enumerate(names) if LAUNCH_RE.match(n)]
    ops = rows[id_in(ev, ev.name[rows], aten_ids)]
    launches = rows[id_in(ev, ev.name[rows], launch_ids)]
    if not len(ops) or not len(launches):
        return None
    op_start = ev.ts[ops].astype(np.float64)
    order = np.argsort(op_start, kind="stable")
    op_ts, op_end = op_start[order], (op_start + ev.dur[ops])[order]
    gpu = rows[ev.stream[rows] != -1]
    ic = v.index_correlation[gpu]
    ic_order = np.argsort(ic, kind="stable")
    ic_sorted = ic[ic_order]
    starts = ev.ts[launches].astype(np.float64)
    deepest = deepest_wrapping(op_ts, op_end, starts, starts + ev.dur[launches])
    lo = np.searchsorted(ic_sorted, ev.index[launches], "left")
    n_kernels = np.searchsorted(ic_sorted, ev.index[launches], "right") - lo
    return launches, ops[order], deepest, lo, n_kernels, gpu, ic_order, starts


def aten_op_launches(v: RankView) -> list[dict]:
    """One row per launch call inside an aten op whose kernel is kept, in HTA's row order."""
    m = _matches(v)
    if m is None:
        return []
    launches, op_rows, deepest, lo, n_kernels, gpu, ic_order, starts = m
    ev, names = v.ev, v.ev.names
    deepest, n_kernels, lo, starts = deepest.tolist(), n_kernels.tolist(), lo.tolist(), starts.tolist()
    out = []
    for n, r in enumerate(launches.tolist()):
        i = deepest[n]
        if n_kernels[n] != 1 or i < 0:
            continue  # outside every aten op, or no kernel kept for this launch (HTA raises there)
        start = starts[n]
        k = gpu[ic_order[lo[n]]]
        op = op_rows[i]
        out.append({"aten_op_name": names[ev.name[op]], "aten_op_start": int(ev.ts[op]) - v.ts0,
                    "aten_op_delay": start - float(ev.ts[op]), "runtime_delay": float(ev.ts[k]) - start,
                    "correlation_id": int(ev.correlation[r]), "kernel_name": names[ev.name[k]]})
    return out


def op_instances(v: RankView) -> list[tuple[str, str, float, float]]:
    """``aten_op_instances(aten_op_launches(v))`` in array operations: no row per launch is built
    (a loop per op instance remains, to join its kernel names)."""
    m = _matches(v)
    if m is None:
        return []
    launches, op_rows, deepest, lo, n_kernels, gpu, ic_order, starts = m
    ev, names = v.ev, v.ev.names
    sel = np.flatnonzero((n_kernels == 1) & (deepest >= 0))   # launches in order, each with one kept kernel
    if not len(sel):
        return []
    op = op_rows[deepest[sel]]
    kernel = gpu[ic_order[lo[sel]]]
    op_delay = starts[sel] - ev.ts[op].astype(np.float64)
    runtime_delay = ev.ts[kernel].astype(np.float64) - starts[sel]
    # an instance is (op name, op start in whole us); instances in (name, start) order, launches in order within
    op_name = ev.name[op]
    uniq, inv = np.unique(op_name, return_inverse=True)
    by_text = np.empty(len(uniq), dtype=np.int64)
    by_text[sorted(range(len(uniq)), key=lambda j: names[uniq[j]])] = np.arange(len(uniq))
    name_rank = by_text[inv.reshape(-1)]
    start_us = ev.ts[op].astype(np.int64)   # int() of the start, as the rows hold it
    order = np.lexsort((start_us, name_rank))   # stable: launches keep their order within an instance
    nr, st = name_rank[order], start_us[order]
    first = np.flatnonzero(np.concatenate(([True], (nr[1:] != nr[:-1]) | (st[1:] != st[:-1]))))
    ends = first[1:].tolist() + [len(order)]
    kernel_names = [names[i] for i in ev.name[kernel[order]].tolist()]
    lead = order[first]
    intern = sys.intern
    return [(names[n], intern(" -> ".join(kernel_names[a:b])), d, r)
            for n, a, b, d, r in zip(op_name[lead].tolist(), first.tolist(), ends, op_delay[lead].tolist(),
                                     runtime_delay[lead].tolist())]


def aten_op_instances(launches: list[dict]) -> list[tuple[str, str, float, float]]:
    """Per op instance (name, start): (op name, kernel sequence "k1 -> k2", op-start-to-first-launch
    delay, first launch-to-kernel delay), in (name, start) order."""
    instances: dict[tuple, list[dict]] = {}
    for row in launches:
        instances.setdefault((row["aten_op_name"], row["aten_op_start"]), []).append(row)
    out = []
    for key in sorted(instances):
        seq = instances[key]
        sequence = sys.intern(" -> ".join(r["kernel_name"] for r in seq))  # ranks repeat the same sequences
        out.append((key[0], sequence, seq[0]["aten_op_delay"], seq[0]["runtime_delay"]))
    return out


def group_instances(instances: list[tuple[str, str, float, float]]) -> dict[tuple[str, str], tuple[list, list]]:
    """Op instances by (op, sequence) -> (first op delays, first runtime delays)."""
    groups: dict = {}
    for op, seq, op_delay, runtime_delay in instances:
        g = groups.get((op, seq))
        if g is None:
            g = groups[(op, seq)] = ([], [])
        g[0].append(op_delay)
        g[1].append(runtime_delay)
    return groups


def summarize_groups(groups: dict[tuple[str, str], tuple[list, list]]) -> list[dict]:
    """Per (aten op, kernel sequence): occurrence count and mean delays (us), most frequent first."""
    return summarize_sums({k: (len(d[0]), math.fsum(d[0]), math.fsum(d[1])) for k, d in groups.items()})


def summarize_sums(sums: dict[tuple[str, str], tuple[int, float, float]]) -> list[dict]:
    """``summarize_groups``' table from each group's (instances, exact sum of op delays, exact sum of
    runtime delays) (us; ``math.fsum``'s)."""
    table = [{"aten_op_name": op, "kernel_sequence": seq, "occurrence_count": n,
              "avg_aten_op_launch_delay": round(op_sum / n, 3), "avg_runtime_delay": round(runtime_sum / n, 3)}
             for (op, seq), (n, op_sum, runtime_sum) in sorted(sums.items())]
    order = sort_desc(np.array([r["occurrence_count"] for r in table], dtype=np.int64))
    return [table[i] for i in order]


def summarize_instances(instances: list[tuple[str, str, float, float]]) -> list[dict]:
    """The table of one list of op instances."""
    return summarize_groups(group_instances(instances))


def aten_op_kernels(launches: list[dict]) -> list[dict]:
    """The table of :func:`summarize_instances` straight from launches (HTA's grouping)."""
    return summarize_instances(aten_op_instances(launches))
