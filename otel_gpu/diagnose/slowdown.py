"""A job or rank slower than its own best: change over time, for a job that is watched while it runs.

The rules compare ranks with each other inside one window; this compares each evaluation's
window with the earlier ones of the same job. Per rank the number followed is its *busy* time per
step (step time minus the seconds blocked in collectives, as the straggler rule reads it; the step
time when collectives are not measured): in synchronous training every rank's step slows when one
rank does, but only the slow rank's busy time rises. The job's number is its median step time.
A window counts once it holds `slowdown.min_steps` steps; its value is compared with the best
(lowest) value of the earlier windows, so start-up (slow first steps) never becomes the reference.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from . import fmt
from .findings import Finding, severity_for
from .model import RankStats, Window
from .straggler import busy_per_step
from .thresholds import Thresholds

RULE = "slowdown"


def rank_value(r: RankStats) -> float | None:
    """Seconds per step rank `r` was busy (not waiting for peers); its step time without collective data."""
    if r.step_count <= 0:
        return None
    if r.collective_s is None:
        return r.mean_step_s
    return sum(busy_per_step(r).values())


@dataclass
class _Best:
    value: float
    t: float                      # end of the window it was seen in (unix s)
    slow_since: float | None = None   # end of the first window of the current slow run


@dataclass
class OwnBest:
    """Each rank's and the job's best so far; `check` once per evaluation, windows in time order."""
    ranks: dict[str, _Best] = field(default_factory=dict)
    job: _Best | None = None

    def check(self, w: Window, th: Thresholds) -> list[Finding]:
        t = th[RULE]
        ok = [r for r in w.ranks if r.step_count >= t["min_steps"]]
        if not ok:
            return []
        slow: list[tuple[RankStats, float, _Best]] = []
        for r in ok:
            v = rank_value(r)
            if v is None or v <= 0:
                continue
            best = self.ranks.get(r.rank)
            if best is None or v < best.value:
                self.ranks[r.rank] = _Best(v, w.end)
                continue
            if v / best.value - 1 >= t["share_warning"]:
                best.slow_since = best.slow_since or w.end
                slow.append((r, v, best))
            else:
                best.slow_since = None
        job_v = statistics.median(r.mean_step_s for r in ok if r.mean_step_s)
        job_slow = None
        if self.job is None or job_v < self.job.value:
            self.job = _Best(job_v, w.end)
        elif job_v / self.job.value - 1 >= t["share_warning"]:
            self.job.slow_since = self.job.slow_since or w.end
            job_slow = job_v
        else:
            self.job.slow_since = None
        if slow and len(slow) < len(ok):   # some ranks, not all: name them
            return [_rank_finding(r, v, b, w, t) for r, v, b in slow]
        if job_slow is not None:
            return [_job_finding(job_slow, self.job, ok, w, t)]
        return []


def _finding(title: str, share: float, t: dict, **fields) -> Finding:
    return Finding(rule=RULE, title=title, severity=severity_for(share, t["share_warning"], t["share_critical"]),
                   confidence="medium", **fields)


def _rank_finding(r: RankStats, v: float, best: _Best, w: Window, t: dict) -> Finding:
    share = v / best.value - 1
    return _finding(
        f"rank {r.rank} busy {fmt.pct(share, 0)} longer per step than at its best", share, t,
        seen=(f"rank {r.rank} on {r.host}: {fmt.secs(v)} busy per step over {fmt.span(w.start, w.end)} against "
              f"{fmt.secs(best.value)} in the window ending {fmt.when(best.t)} UTC"),
        why="a rank that computes slower than it did holds every other rank at the next collective",
        action=f"see what changed on {r.host} since {fmt.when(best.slow_since or w.end)} UTC (other processes, "
               f"clocks, thermals, input); `otel-gpu diagnose` over the slow window names the phase",
        basis="busy seconds per step (step time minus collective waits) of this window against the lowest of the "
              "earlier windows of this watch",
        where={"ranks": [r.rank], "nodes": [r.host]},
        evidence={"busy_per_step_s": round(v, 6), "best_s": round(best.value, 6), "best_t": best.t,
                  "since": best.slow_since, "share": round(share, 4)})


def _job_finding(v: float, best: _Best, ranks: list[RankStats], w: Window, t: dict) -> Finding:
    share = v / best.value - 1
    return _finding(
        f"steps {fmt.pct(share, 0)} slower than the job's best", share, t,
        seen=(f"median step {fmt.secs(v)} over {fmt.span(w.start, w.end)} against {fmt.secs(best.value)} in the "
              f"window ending {fmt.when(best.t)} UTC, on every rank alike"),
        why="the whole job does less work per second than it did",
        action="the other findings of this window say where the time went (input, checkpoints, communication)",
        basis="median over ranks of the mean step time of this window against the lowest of the earlier windows",
        where={"ranks": [r.rank for r in ranks], "nodes": sorted({r.host for r in ranks})},
        evidence={"step_s": round(v, 6), "best_s": round(best.value, 6), "best_t": best.t,
                  "since": best.slow_since, "share": round(share, 4)})
