"""What changed between two runs: per CPU op and per GPU kernel count, total and mean time (us).

Both sets are loaded as for ``analyze`` (HTA's last-step rule), summed over their ranks, and
divided by the number of ranks so runs of different sizes compare per rank. Rows are sorted
by impact: the absolute change of total time. Nanosecond traces are rounded to whole us as HTA
does (start up, end down); an event shorter than 1 us then lasts 0 us (the reader's rule), so
no total is negative; the notes of both loads say how many there were.
"""
from __future__ import annotations

import numpy as np

from .breakdown import temporal_breakdown
from .model import RankView, TraceSet

OP_CATS = ("cpu_op", "Operator")


def _aggregate(views: list[RankView]) -> dict[tuple[str, str], list[float]]:
    """(kind, name) -> [count, total us] summed over ranks."""
    agg: dict[tuple[str, str], list[float]] = {}
    for v in views:
        ev = v.ev
        rows = v.rows
        gpu = ev.stream[rows] != -1
        op = ~gpu & np.isin(ev.cat[rows], v.symbol_ids(OP_CATS))
        for kind, m in (("kernel", gpu), ("op", op)):
            names = ev.name[rows[m]]
            dur = ev.dur[rows[m]]
            if not len(names):
                continue
            uniq, inv = np.unique(names, return_inverse=True)
            counts = np.bincount(inv)
            totals = np.bincount(inv, weights=dur)
            for u, c, t in zip(uniq.tolist(), counts.tolist(), totals.tolist()):
                slot = agg.setdefault((kind, v.names[u]), [0.0, 0.0])
                slot[0] += c
                slot[1] += t
    return agg


def diff_sets(a: TraceSet, b: TraceSet, top: int | None = None) -> dict:
    """Per-op and per-kernel changes from run ``a`` to run ``b``, biggest impact first."""
    va, vb = list(a.ranks.values()), list(b.ranks.values())
    na, nb = max(1, len(va)), max(1, len(vb))
    ag, bg = _aggregate(va), _aggregate(vb)
    notes = [f"{label}: {n}" for label, ts in (("A", a), ("B", b)) for n in ts.notes
             if "shorter than 1 us" in n or "not analysed" in n]
    rows = []
    for key in set(ag) | set(bg):
        ca, ta = (x / na for x in ag.get(key, [0.0, 0.0]))
        cb, tb = (x / nb for x in bg.get(key, [0.0, 0.0]))
        ma = ta / ca if ca else None
        mb = tb / cb if cb else None
        rows.append({"kind": key[0], "name": key[1], "count_a": ca, "count_b": cb, "total_a_us": ta,
                     "total_b_us": tb, "delta_total_us": tb - ta, "mean_a_us": ma, "mean_b_us": mb,
                     "delta_mean_us": (mb - ma) if ma is not None and mb is not None else None,
                     "delta_pct": round(100 * (tb - ta) / ta, 2) if ta else None,
                     "status": "added" if not ca else "removed" if not cb else "changed"})
    rows.sort(key=lambda r: (-abs(r["delta_total_us"]), r["kind"], r["name"]))
    if top:
        rows = rows[:top]

    def span(views):
        t = [x for x in (temporal_breakdown(v) for v in views) if x]
        if not t:
            return None
        return {"kernel_time_us": float(np.mean([x["kernel_time_us"] for x in t])),
                "idle_time_pctg": float(np.mean([x["idle_time_pctg"] for x in t])),
                "compute_time_pctg": float(np.mean([x["compute_time_pctg"] for x in t]))}
    return {"a": a.path, "b": b.path, "ranks_a": len(va), "ranks_b": len(vb),
            "summary_a": span(va), "summary_b": span(vb), "notes": notes, "rows": rows}
