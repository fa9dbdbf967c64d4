"""Evaluation passes: their share of the ranks' wall time, and what brings it down.

No step advances while the ranks evaluate: the training side keeps an evaluation pass out of the
step that contains it, as its own phase ("eval": `evaluate` of the HF Trainer, Lightning's
validation loop, a plain loop's model called under `no_grad` / `inference_mode` / after
`model.eval()`). A rank's evaluation time is its eval phase seconds (own time) plus the collective
wait inside eval that every evaluating rank had: the least of their waits, the collectives' own time
(the loss or metric all-reduce of a distributed evaluation). What a rank waited beyond that, it waited
for another rank: one still evaluating (whose own eval seconds count it), or one doing something else
first, such as rank 0 saving a checkpoint while rank 1 enters eval and blocks in its first all-reduce
(the checkpoint finding counts those seconds, on every rank) or a slow step (the straggler rule's).
Counting that wait here too counted the same seconds under two findings. In synchronous training
every rank waits for the slowest evaluation, so the share reported is the largest of the ranks'. With
GPUs, their activity during eval against training says whether the evaluation at least keeps them busy.
"""
from __future__ import annotations

import statistics

from ..words import count
from . import fmt
from . import timeseries as ts
from .findings import Finding, severity_for
from .model import RankStats, Window
from .thresholds import Thresholds

PHASE = "eval"
PHASE_EPS = 0.01   # ranks in eval (timeline value) above this: an evaluation is running


def shared_wait(ranks: list[RankStats]) -> float:
    """Seconds of collective wait inside eval that every evaluating rank had (the least of theirs, over
    the ranks whose collectives are measured): the collectives' own time, not a wait for another rank."""
    waits = [r.collective_by_phase.get(PHASE, 0.0) for r in ranks
             if r.collective_s is not None and (r.phases.get(PHASE, 0.0) > 0 or r.collective_by_phase.get(PHASE, 0.0) > 0)]
    return min(waits) if waits else 0.0


def eval_seconds(r: RankStats, shared: float) -> float:
    """Seconds rank `r` spent evaluating in the window: eval phase time plus `shared` (see `shared_wait`),
    at most its own wait inside eval; 0 for a rank that never evaluated."""
    own, waited = r.phases.get(PHASE, 0.0), r.collective_by_phase.get(PHASE, 0.0)
    return own + min(shared, waited) if own > 0 or waited > 0 else 0.0


def passes(w: Window) -> tuple[list[tuple[float, float]], float | None]:
    """((start, end) unix s of the evaluation passes seen on the timeline, median seconds between their
    starts); passes closer than one timeline step read as one."""
    mask = ts.phase_mask(w.timeline, PHASE, PHASE_EPS)
    ranges = [(e.start, e.end) for e in ts.events(w.timeline.t, mask, [1.0] * len(mask), w.step_s)]
    every = statistics.median(b[0] - a[0] for a, b in zip(ranges, ranges[1:])) if len(ranges) >= 2 else None
    return ranges, every


def _activity(w: Window) -> tuple[str, float, float] | None:
    """(signal, mean during eval, mean during the rest of training) of GPU activity; None without GPU series."""
    sig = ts.activity(w, training_only=False)
    if sig is None or sig[0] == "step rate":
        return None
    mask = ts.phase_mask(w.timeline, PHASE, PHASE_EPS)
    if not any(mask):
        return None
    a_in, a_out = ts.during(w, mask, sig[1])
    return (sig[0], a_in, a_out) if a_in is not None and a_out else None


def _advice(share: float, every: float | None, target: float) -> str:
    out = []
    if every and share > target:
        out.append(f"evaluate less often: every {fmt.secs(every * share / target)} instead of every "
                   f"{fmt.secs(every)} brings the share to about {fmt.pct(target)} (HF Trainer: a larger eval_steps; "
                   f"Lightning: val_check_interval / check_val_every_n_epoch)")
    else:
        out.append("evaluate less often (HF Trainer: a larger eval_steps; Lightning: val_check_interval / "
                   "check_val_every_n_epoch)")
    out += ["on fewer batches: a fixed subset of the validation set (HF: a smaller eval_dataset; Lightning: "
            "limit_val_batches)",
            "with a larger eval batch under torch.inference_mode() (no activations kept for backward)",
            "or asynchronously: save a checkpoint and evaluate it in a separate process or on a spare GPU while "
            "training goes on"]
    return "; ".join(out)


def evaluation(w: Window, th: Thresholds) -> list[Finding]:
    """Evaluation's share of the ranks' wall time (the largest of the ranks'), reported from
    `eval.share_min`, a warning from `eval.share_warning`, critical from `eval.share_critical`."""
    t = th["eval"]
    shared = shared_wait(w.ranks)
    per = {r.rank: (r, eval_seconds(r, shared), w.rank_wall_s(r)) for r in w.ranks}
    per = {k: v for k, v in per.items() if v[1] > 0 and v[2] > 0}
    if not per:
        return []
    shares = {k: min(1.0, s / wall) for k, (_, s, wall) in per.items()}
    worst = max(shares, key=shares.get)
    share = shares[worst]
    if share < t["share_min"]:
        return []
    r, secs, wall = per[worst]
    lost = secs * max(len(w.ranks), 1)   # synchronous training: every rank waits for the slowest evaluation
    ranges, every = passes(w)
    seen = f"rank {r.rank} on {r.host} evaluated {fmt.secs(secs)} of {fmt.secs(wall)}"
    if ranges:
        seen += (f" ({count(len(ranges), 'pass')} seen"
                 + (f", one every {fmt.secs(every)}" if every else "") + ")")
    waited = r.collective_by_phase.get(PHASE, 0.0)
    counted = min(shared, waited)
    if counted > 0:
        seen += f"; {fmt.secs(counted)} of it blocked in collectives inside eval"
    others = {k: v[0].collective_by_phase.get(PHASE, 0.0) - min(shared, v[0].collective_by_phase.get(PHASE, 0.0))
              for k, v in per.items()}
    others = {k: v for k, v in others.items() if v >= 0.0005}
    if others:
        seen += ("; left out, as waits for other ranks (their evaluation, or a checkpoint save or slow step that "
                 "other findings count): " + ", ".join(f"rank {k} {fmt.secs(v)}" for k, v in sorted(others.items()))
                 + " blocked inside eval beyond the collectives' own time")
    if len(per) > 1:
        seen += "; " + ", ".join(f"rank {k} {fmt.pct(v)}" for k, v in sorted(shares.items()))
    act = _activity(w)
    drop = None
    if act is not None:
        what, a_in, a_out = act
        drop = max(0.0, 1.0 - a_in / a_out)
        seen += f"; {what} {fmt.pct(a_in)} during eval vs {fmt.pct(a_out)} otherwise"
    low = drop is not None and drop >= t["activity_drop"]
    why = (f"no training step advances while the ranks evaluate: about {fmt.gpu_time(lost, w.unit)} "
           f"({fmt.pct(share)} of the job's time)")
    if low:
        why += f", with the GPUs at {fmt.pct(1 - drop)} of their training activity"
    return [Finding(
        rule="eval",
        title=f"evaluation takes {fmt.pct(share)} of the time",
        severity=severity_for(share, t["share_warning"], t["share_critical"]),
        confidence="high",
        seen=seen, why=why,
        action=_advice(share, every, t["share_warning"] * 0.5),
        lost_s=lost, lost_share=share,
        basis="eval phase seconds plus the collective wait inside eval every evaluating rank had (the least of "
              "the ranks': a rank's wait beyond it is time spent waiting for another rank, counted where that rank's "
              "time is: its own eval seconds, a checkpoint save, a slow step), of the rank with the largest share, "
              "x ranks, over that rank's wall time in the window",
        where={"ranks": sorted(per, key=lambda k: (int(k) if k.isdigit() else 1 << 30, k)),
               "nodes": sorted({v[0].host for v in per.values()})},
        ranges=ranges,
        evidence={"eval_s": round(secs, 3), "wall_s": round(wall, 3), "share": round(share, 4),
                  "per_rank_share": {k: round(v, 4) for k, v in shares.items()},
                  "eval_collective_s": round(counted, 3), "eval_collective_left_out_s": {k: round(v, 3) for k, v in others.items()},
                  "passes": len(ranges), "every_s": every,
                  "activity_drop": drop},
    )]
