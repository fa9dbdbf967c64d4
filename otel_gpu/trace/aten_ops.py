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
"""
from __future__ import annotations

import re

import numpy as np

from .breakdown import sort_desc
from .model import RankView

LAUNCH_RE = re.compile(r"(cuda.*LaunchKernel)|(cuLaunchKernel)|(^runFunction)")
_SCAN = 64  # ops looked at backwards before a vectorized search


def _deepest(op_ts: np.ndarray, op_end: np.ndarray, op_pos: np.ndarray, j: int, end: float) -> int:
    """Index (into the ts-sorted ops) of the latest-starting op among ``op_ts[:j + 1]`` (those
    starting before the call) that ends at or after ``end``, the first in row order among equal
    starts; -1 when none."""
    found = -1
    lo = max(-1, j - _SCAN)
    while j > lo:
        if op_end[j] >= end:
            found = j
            break
        j -= 1
    if found < 0 and j >= 0:  # long scan: all remaining candidates at once
        ok = np.flatnonzero(op_end[: j + 1] >= end)
        if len(ok) == 0:
            return -1
        found = int(ok[-1])
    t = op_ts[found]
    best = found
    k = found - 1
    while k >= 0 and op_ts[k] == t:  # equal starts: the first in row order wins (pandas' sort order)
        if op_end[k] >= end and op_pos[k] < op_pos[best]:
            best = k
        k -= 1
    return best


def aten_op_launches(v: RankView) -> list[dict]:
    """One row per launch call inside an aten op whose kernel is kept, in HTA's row order."""
    ev, rows = v.ev, v.rows
    names = ev.names
    aten_ids = [i for i, n in enumerate(names) if n.startswith("aten::")]
    launch_ids = [i for i, n in enumerate(names) if LAUNCH_RE.match(n)]
    ops = rows[np.isin(ev.name[rows], aten_ids)]
    launches = rows[np.isin(ev.name[rows], launch_ids)]
    if not len(ops) or not len(launches):
        return []
    op_start = ev.ts[ops].astype(np.float64)
    order = np.argsort(op_start, kind="stable")
    op_ts, op_end = op_start[order], (op_start + ev.dur[ops])[order]
    op_rows = ops[order]
    op_pos = order  # row-order position of each sorted op
    gpu = rows[ev.stream[rows] != -1]
    ic = v.index_correlation[gpu]
    ic_order = np.argsort(ic, kind="stable")
    ic_sorted = ic[ic_order]
    starts = ev.ts[launches].astype(np.float64)
    last_before = (np.searchsorted(op_ts, starts, "right") - 1).tolist()
    ends = (starts + ev.dur[launches]).tolist()
    lo = np.searchsorted(ic_sorted, ev.index[launches], "left")
    n_kernels = (np.searchsorted(ic_sorted, ev.index[launches], "right") - lo).tolist()
    lo = lo.tolist()
    out = []
    for n, r in enumerate(launches.tolist()):
        if n_kernels[n] != 1:
            continue  # no kernel kept for this launch (or several): HTA raises
        i = _deepest(op_ts, op_end, op_pos, last_before[n], ends[n])
        if i < 0:
            continue
        start = starts[n]
        k = gpu[ic_order[lo[n]]]
        op = op_rows[i]
        out.append({"aten_op_name": names[ev.name[op]], "aten_op_start": int(ev.ts[op]) - v.ts0,
                    "aten_op_delay": start - float(ev.ts[op]), "runtime_delay": float(ev.ts[k]) - start,
                    "correlation_id": int(ev.correlation[r]), "kernel_name": names[ev.name[k]]})
    return out


def aten_op_kernels(launches: list[dict]) -> list[dict]:
    """Per (aten op, kernel sequence): occurrence count and mean delays (us), most frequent first."""
    instances: dict[tuple, list[dict]] = {}
    for row in launches:
        instances.setdefault((row["aten_op_name"], row["aten_op_start"]), []).append(row)
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for key in sorted(instances):
        seq = instances[key]
        groups.setdefault((key[0], " -> ".join(r["kernel_name"] for r in seq)), []).append(
            (seq[0]["aten_op_delay"], seq[0]["runtime_delay"]))
    table = [{"aten_op_name": op, "kernel_sequence": seq, "occurrence_count": len(d),
              "avg_aten_op_launch_delay": round(float(np.mean([x for x, _ in d])), 3),
              "avg_runtime_delay": round(float(np.mean([y for _, y in d])), 3)}
             for (op, seq), d in sorted(groups.items())]
    order = sort_desc(np.array([r["occurrence_count"] for r in table], dtype=np.int64))
    return [table[i] for i in order]
