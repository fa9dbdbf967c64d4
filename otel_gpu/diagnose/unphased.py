"""Time outside every measured phase: the share of each rank's step time no phase covers.

A rank's step time is counted between step boundaries, evaluation left out (the timer keeps an eval
pass out of the step that holds it); its phases (data_wait, forward, backward, optimizer, checkpoint,
the job's own) are exclusive seconds, and the seconds it blocks in collectives are counted apart. What
is left, step time minus every phase but eval and minus every collective wait outside eval, is time
the training side cannot name: a batch iterator that is not a torch DataLoader (a
generator of the user's own), logging and metric calls, host work between steps, a model call no
hook times. When every rank spends a large share of its steps there, the finding says how much, per
rank, and what it can be; the straggler rule covers one rank with more than the others.

Phases that happen outside the step boundaries (a framework that opens its step after fetching the
batch) are still subtracted: the share is then an underestimate, never an invented one.
"""
from __future__ import annotations

from .. import names as N
from . import fmt
from .findings import Finding, severity_for
from .model import RankStats, Window
from .thresholds import Thresholds


def unphased(r: RankStats) -> tuple[float, float] | None:
    """(seconds of step time outside every phase, their share of step time) of rank `r`; None without
    counted steps. Seconds blocked in collectives are measured too (the communication rule's), inside a
    phase or not (a phase's seconds are its own time, without them): they are not counted here."""
    if r.step_count <= 0 or r.step_time_s <= 0:
        return None
    inside = lambda d: sum(v for p, v in d.items() if p not in N.OUTSIDE_STEPS)   # noqa: E731 (eval is not step time)
    outside = max(0.0, r.step_time_s - inside(r.phases) - inside(r.collective_by_phase))
    return outside, outside / r.step_time_s


def candidates(ranks: list[RankStats], recorded: bool) -> list[str]:
    """What the unphased time can be, from the phases the ranks do and do not report."""
    have = set().union(*(r.phases.keys() for r in ranks)) if ranks else set()
    out = []
    if "data_wait" not in have:
        out.append("fetching batches from the job's own iterator or generator (no torch DataLoader was "
                   "iterated" + (": its iteration would have been timed as data_wait)" if recorded else ")"))
    else:
        out.append("batch preparation outside the DataLoader (moving, collating or tokenizing batches in the loop)")
    if "forward" not in have:
        out.append("the model call (no forward phase was timed)")
    out.append("logging and metric calls (`.item()`, printing, writing to disk) and other host work between "
               "the phases, such as the loss computation and `zero_grad`")
    return out


def unphased_time(w: Window, th: Thresholds) -> list[Finding]:
    """Step time outside every phase, on every rank above `unphased.share_min` (the least of the ranks'
    shares: what every rank pays)."""
    t = th["unphased"]
    per = {r.rank: (r, x) for r in w.ranks if (x := unphased(r)) is not None}
    if not per:
        return []
    least = min(per, key=lambda k: per[k][1][1])
    share = per[least][1][1]
    if share < t["share_min"]:
        return []
    ranks = [r for r, _ in per.values()]
    worst = max(per, key=lambda k: per[k][1][1])
    per_step = {k: x[0] / r.step_count for k, (r, x) in per.items()}
    lost = sum(share * w.rank_wall_s(r) for r in ranks)
    can_be = candidates(ranks, w.source == "recording")
    spread = (f" (rank {least} {fmt.pct(share)} to rank {worst} {fmt.pct(per[worst][1][1])})" if len(per) > 1 else "")
    table = "; ".join(f"rank {k}: {fmt.pct(x[1])}, {fmt.secs(per_step[k])} per step" for k, (_, x) in per.items())
    wrap = ("time your own batch fetch with `with otel_gpu.training.phase('data_wait'):` (and other host work with "
            "a phase of its own) so the next run names it; " if "data_wait" not in set().union(*(r.phases for r in ranks))
            else "")
    return [Finding(
        rule="unphased",
        title=f"{fmt.pct(share)} of {'every rank' if len(per) > 1 else 'the rank'}'s step time is outside "
              f"any measured phase",
        severity=severity_for(share, t["share_warning"], t["share_critical"]),
        confidence="medium",
        seen=f"step time (evaluation never in it) minus every phase but eval (data_wait, forward, backward, optimizer, "
             f"checkpoint and the job's own) and every collective wait outside eval: "
             f"at least {fmt.pct(share)} on each of {fmt.count(len(per), 'rank')}{spread}; {table}",
        why=f"no phase accounts for about {fmt.gpu_time(lost, w.unit)} ({fmt.pct(share)} of the job's time), so "
            f"no other finding can name it. It can be: " + "; ".join(can_be),
        action=wrap + "look at the flame graph of the training thread outside the phases (the profile's samples "
               "with no phase label); a batch iterator of your own: prefetch in a background thread or move it "
               "into a torch DataLoader with workers; logging: log every N steps and avoid `.item()` in the loop",
        lost_s=lost, lost_share=share,
        basis="the least unphased share of any rank (what every rank pays) x each rank's wall time; an upper "
              "bound of what can be saved (part of it may be necessary host work)",
        where={"ranks": list(per), "nodes": sorted({r.host for r in ranks})},
        evidence={"share": round(share, 4),
                  "per_rank_share": {k: round(x[1], 4) for k, (_, x) in per.items()},
                  "per_rank_s_per_step": {k: round(v, 6) for k, v in per_step.items()},
                  "can_be": can_be},
    )]
