"""Findings across ranks: one finding per anti-pattern naming the ranks affected and the spread,
linked when one pattern causes another.

A rank is affected by a pattern when its check triggers *and* the time at stake is at least
``Thresholds.min_time_share_pct`` % of that rank's analysed span (GPU span; the steps or the
trace on CPU-only traces). Links: GPU idle is attributed to a cause when the idle gaps of
that cause (:mod:`.idle_causes`: a draining sync, cudaMalloc/cudaFree, launch starvation) make
up at least ``Thresholds.link_min_share_pct`` % of the idle time on the ranks both affect.
Times in us.
"""
from __future__ import annotations

import numpy as np

from .findings import FIXES, TITLES, Thresholds
from .median import median

CAUSES_OF_IDLE = ("queue_drain_sync", "alloc_thrash", "many_short_kernels")
EFFECT = "long_gpu_idle"
STAKE_IS_IDLE = ("queue_drain_sync", "many_short_kernels")  # their time at stake is the idle they cause


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def _spread(values: list[float]) -> dict:
    a = np.asarray(values, dtype=np.float64)
    return {"min": round(float(a.min()), 3), "median": round(median(values), 3),
            "max": round(float(a.max()), 3)}


def _group(pattern: str, hit: list[dict], below: list[dict], n_ranks: int) -> dict:
    worst = max(hit, key=lambda c: c["time_at_stake_us"])
    ranks = sorted(c["rank"] for c in hit)
    return {
        "pattern": pattern, "title": TITLES[pattern], "ranks": ranks, "ranks_text": rank_ranges(ranks),
        "ranks_analysed": n_ranks,
        "ranks_triggered_below_min_share": sorted(c["rank"] for c in below),
        "indicator": {"name": worst["indicator"], "threshold": worst["threshold"],
                      **_spread([c["value"] for c in hit])},
        "time_at_stake_us": round(sum(c["time_at_stake_us"] for c in hit), 1),
        "time_at_stake_per_rank_us": _spread([c["time_at_stake_us"] for c in hit]),
        "share_of_span_pct": _spread([c["share_of_span_pct"] for c in hit]),
        "span": worst["span"],
        "worst_rank": worst["rank"], "where": worst["where"], "fix": worst.get("fix") or FIXES[pattern],
        "caused_by": [], "leads_to": [],
    }


def group_findings(checks: list[dict], th: Thresholds | None = None) -> list[dict]:
    """Findings (one per pattern) from per-rank checks, biggest ``impact_pct`` first: the median
    share of the span at stake plus, for a cause, the share of the GPU idle it explains."""
    th = th or Thresholds()
    n_ranks = len({c["rank"] for c in checks})
    by_pattern: dict[str, list[dict]] = {}
    for c in checks:
        by_pattern.setdefault(c["pattern"], []).append(c)
    findings: dict[str, dict] = {}
    for pattern, cs in by_pattern.items():
        hit = [c for c in cs if c["reported"]]
        if hit:
            below = [c for c in cs if c["triggered"] and not c["reported"]]
            findings[pattern] = _group(pattern, hit, below, n_ranks)
    _link(findings, by_pattern, th)
    for f in findings.values():  # a cause weighs its own time plus the idle it explains (unless that idle
        # is already its time at stake)
        f["impact_pct"] = round(f["share_of_span_pct"]["median"] + (0 if f["pattern"] in STAKE_IS_IDLE else sum(
            findings[link["pattern"]]["share_of_span_pct"]["median"] * link["share_of_idle_pct"] / 100
            for link in f["leads_to"])), 3)
    return sorted(findings.values(), key=lambda f: (-f["impact_pct"], f["pattern"]))


def _link(findings: dict[str, dict], by_pattern: dict[str, list[dict]], th: Thresholds) -> None:
    effect = findings.get(EFFECT)
    if effect is None:
        return
    idle = {c["rank"]: c["time_at_stake_us"] for c in by_pattern[EFFECT] if c["reported"]}
    for cause in CAUSES_OF_IDLE:
        f = findings.get(cause)
        if f is None:
            continue
        both = [c for c in by_pattern[cause] if c["reported"] and c["rank"] in idle]
        explained = sum(c.get("idle_caused_us", 0.0) for c in both)
        idle_total = sum(idle[c["rank"]] for c in both)
        if not both or not idle_total or 100 * explained / idle_total < th.link_min_share_pct:
            continue
        share = round(100 * explained / idle_total, 1)
        ranks = sorted(c["rank"] for c in both)
        f["leads_to"].append({"pattern": EFFECT, "idle_us": round(explained, 1), "share_of_idle_pct": share,
                              "ranks_text": rank_ranges(ranks)})
        effect["caused_by"].append({"pattern": cause, "idle_us": round(explained, 1), "share_of_idle_pct": share,
                                    "ranks_text": rank_ranges(ranks)})
    effect["caused_by"].sort(key=lambda c: -c["idle_us"])
