"""A job or rank slower than it was: change over time, for a job that is watched while it runs.

The rules compare ranks with each other inside one window; this compares each evaluation's
window with the earlier ones of the same job. Per rank the number followed is its *busy* time per
step (step time minus the seconds blocked in collectives, as the straggler rule reads it; the step
time when collectives are not measured): in synchronous training every rank's step slows when one
rank does, but only the slow rank's busy time rises. The job's number is its median step time.
A window counts once it holds `slowdown.min_steps` steps; its value is compared with the median of
the earlier windows that were not slow (at least `MIN_EARLIER` of them), and a slowdown is said once it
has lasted a third of the window: a node whose ranks drift for a few seconds says nothing.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from . import fmt
from .findings import Finding, severity_for
from .model import RankStats, Window
from .straggler import busy_per_step
from .thresholds import Thresholds

RULE = "slowdown"
MAX_HISTORY = 60      # earlier windows remembered (10 min at one evaluation every 10 s)
MIN_EARLIER = 3       # earlier windows needed before a window is judged
PERSIST_SHARE = 1 / 3  # said once it has lasted this share of the window


def rank_value(r: RankStats) -> float | None:
    """Seconds per step rank `r` was busy (not waiting for peers); its step time without collective data."""
    if r.step_count <= 0:
        return None
    if r.collective_s is None:
        return r.mean_step_s
    return sum(busy_per_step(r).values())


@dataclass
class _History:
    """One rank's (or the job's) values of the earlier windows that were not slow."""
    values: deque = field(default_factory=lambda: deque(maxlen=MAX_HISTORY))   # (window end, value)
    slow_since: float | None = None   # end of the first window of the current slow run

    def baseline(self) -> float | None:
        """The median of the earlier normal windows: one fast or slow window moves it little."""
        return statistics.median(v for _, v in self.values) if len(self.values) >= MIN_EARLIER else None

    def judge(self, end: float, v: float, share_min: float, persist_s: float) -> float | None:
        """The share `v` is above the baseline once that has lasted `persist_s`, else None; a window
        that is not slow joins the baseline."""
        base = self.baseline()
        if base is None or base <= 0 or v / base - 1 < share_min:
            self.slow_since = None
            self.values.append((end, v))
            return None
        self.slow_since = self.slow_since or end
        return v / base - 1 if end - self.slow_since >= persist_s else None


@dataclass
class OwnBest:
    """Each rank's and the job's history; `check` once per evaluation, windows in time order."""
    ranks: dict[str, _History] = field(default_factory=dict)
    job: _History = field(default_factory=_History)

    def check(self, w: Window, th: Thresholds) -> list[Finding]:
        t = th[RULE]
        ok = [r for r in w.ranks if r.step_count >= t["min_steps"] and (rank_value(r) or 0) > 0]
        if not ok:
            return []
        persist = w.duration_s * PERSIST_SHARE
        slow = []
        for r in ok:
            h = self.ranks.setdefault(r.rank, _History())
            v = rank_value(r)
            share = h.judge(w.end, v, t["share_warning"], persist)
            if share is not None:
                slow.append((r, v, share, h))
        job_v = statistics.median(r.mean_step_s for r in ok if r.mean_step_s)
        job_share = self.job.judge(w.end, job_v, t["share_warning"], persist)
        if slow and len(slow) < len(ok):   # some ranks, not all: name them
            return [_rank_finding(r, v, share, h, w, t) for r, v, share, h in slow]
        if job_share is not None:
            return [_job_finding(job_v, job_share, self.job, ok, w, t)]
        return []


def _finding(title: str, share: float, t: dict, **fields) -> Finding:
    return Finding(rule=RULE, title=title, severity=severity_for(share, t["share_warning"], t["share_critical"]),
                   confidence="medium", **fields)


def _rank_finding(r: RankStats, v: float, share: float, h: _History, w: Window, t: dict) -> Finding:
    base = h.baseline()
    return _finding(
        f"rank {r.rank} busy {fmt.pct(share, 0)} longer per step than before", share, t,
        seen=(f"rank {r.rank} on {r.host}: {fmt.secs(v)} busy per step over {fmt.span(w.start, w.end)} against "
              f"{fmt.secs(base)} in its earlier windows (median of {len(h.values)})"),
        why="a rank that computes slower than it did holds every other rank at the next collective",
        action=f"see what changed on {r.host} since {fmt.when(h.slow_since or w.end)} UTC (other processes, "
               f"clocks, thermals, input); `otel-gpu diagnose` over the slow window names the phase",
        basis="busy seconds per step (step time minus collective waits) of this window against the median of the "
              "earlier windows of this watch that were not slow",
        where={"ranks": [r.rank], "nodes": [r.host]},
        evidence={"busy_per_step_s": round(v, 6), "baseline_s": round(base, 6), "since": h.slow_since,
                  "share": round(share, 4)})


def _job_finding(v: float, share: float, h: _History, ranks: list[RankStats], w: Window, t: dict) -> Finding:
    base = h.baseline()
    return _finding(
        f"steps {fmt.pct(share, 0)} slower than before", share, t,
        seen=(f"median step {fmt.secs(v)} over {fmt.span(w.start, w.end)} against {fmt.secs(base)} in the job's "
              f"earlier windows (median of {len(h.values)}), on every rank alike"),
        why="the whole job does less work per second than it did",
        action="the other findings of this window say where the time went (input, checkpoints, communication)",
        basis="median over ranks of the mean step time of this window against the median of the earlier windows "
              "that were not slow",
        where={"ranks": [r.rank for r in ranks], "nodes": sorted({r.host for r in ranks})},
        evidence={"step_s": round(v, 6), "baseline_s": round(base, 6), "since": h.slow_since,
                  "share": round(share, 4)})
