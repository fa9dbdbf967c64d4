"""Stragglers and communication from GPU-timed collectives (NCCL, `otelgpu.collective.basis="gpu"`).

A GPU-timed collective lasts from its kernel's start on a rank to the end of the exchange, so it
includes the time that rank waited for the last one to arrive. Per step, the rank with the least
collective time is the last to arrive: its collective time is the communication itself, and every
other rank's excess over it is its wait for the late ones. This holds with communication overlapped
with compute or not (the wait is inside the collective either way), which host phase times, on the
host's clock and with the GPU running ahead, cannot say. How much of the communication is exposed
(the compute stream stalled) is not measured: the findings say so and stop at "warning".
"""
from __future__ import annotations

import statistics

from .. import names as N
from ..words import count, noun
from . import fmt
from .findings import Finding, missing_input, severity_for
from .model import RankStats, Window
from .thresholds import Thresholds

OUTSIDE_STEP = ("checkpoint", "eval")
MIN_POINTS = 3
EXPOSURE = ("not measured: a GPU-timed collective runs on its own stream, so its time may be hidden behind "
            "compute (DDP's bucketed all-reduce, ZeRO-3 prefetch) or stall it; what it costs the step lies between "
            "0 and the time shown")
OVERLAP_NOTE = ("The wait is exact where communication does not overlap compute; where it does, one late arrival "
                "holds up several overlapped collectives at once and the step loses less: an upper bound there")
ZERO_WORDS = {"all_gather": "parameter fetch (all-gather)", "reduce_scatter": "gradient reduce (reduce-scatter)",
              "all_reduce": "all-reduce"}


# why a rank's NCCL collectives were not measured, in words (otelgpu.collective.unmeasured_reason)
REASON_TEXT = {
    "timing_off": "NCCL timing is off (TORCH_NCCL_ENABLE_TIMING=0, or a torch that cannot turn it on)",
    "ring_overflow": "Flight Recorder records were overwritten between polls",
    "no_flight_recorder": "no NCCL Flight Recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=0, or a torch without one)",
    "max_connections_1": "CUDA_DEVICE_MAX_CONNECTIONS=1, where timing events would serialise communication "
                         "and compute, so timing was left off",
    "no_records": "the Flight Recorder stayed empty while steps ran (collectives replayed in CUDA graphs are "
                  "not recorded)",
    "dump_failed": "reading the Flight Recorder failed",
}


def why_unmeasured(ranks: list[RankStats]) -> str:
    """'; rank 1: <reason>, ...' for the ranks that said why their collectives were not measured."""
    said = {}
    for r in ranks:
        for reason in sorted(r.collective_unmeasured):
            said.setdefault(REASON_TEXT.get(reason, reason), []).append(r.rank)
    return "".join(f"; {noun(len(v), 'rank')} {fmt.compact(v)}: {k}" for k, v in said.items())


def mixed_bases(rule: str, what: str, ranks: list[RankStats]) -> Finding:
    """Host-blocked and GPU-timed seconds are not comparable: the rule says so instead of mixing them."""
    by = {}
    for r in ranks:
        by.setdefault(r.collective_basis or "host", []).append(r.rank)
    shown = "; ".join(f"{b}: {noun(len(v), 'rank')} {fmt.compact(v)}" for b, v in sorted(by.items()))
    return missing_input(rule, what, f"ranks report collective time on different bases ({shown}): host-blocked "
                         "(gloo) and GPU-timed (NCCL) seconds are never compared; run every rank on one backend",
                         ["comparable collective time"])


def per_step(r: RankStats) -> float:
    """GPU seconds in collectives per step of one rank."""
    return (r.collective_s or 0.0) / r.step_count


def host_phase_per_step(r: RankStats) -> dict[str, float]:
    """Host-clock seconds per step in each phase, and the rest of the step as "unphased" (checkpoint
    and eval, judged by their own rules, left out)."""
    n = r.step_count
    out = {p: s / n for p, s in r.phases.items() if p not in OUTSIDE_STEP}
    step = (r.step_time_s - sum(r.phases.get(p, 0.0) for p in OUTSIDE_STEP if p not in N.OUTSIDE_STEPS)) / n
    out["unphased"] = max(0.0, step - sum(out.values()))
    return out


def straggler(w: Window, th: Thresholds, ranks: list[RankStats], consistency, causes, action) -> list[Finding]:
    """The rank the others wait for: the least GPU collective time per step (it arrives last)."""
    t, sev = th["straggler"], th["severity"]
    coll = {r.rank: per_step(r) for r in ranks}
    name = min(coll, key=coll.get)
    others = [k for k in coll if k != name]
    ref = statistics.median(coll[k] for k in others)
    late = ref - coll[name]   # what the median other rank waits per step beyond the last arriver
    step = statistics.median(r.mean_step_s for r in ranks)
    if late < t["lateness_min_s"] or late < t["lateness_share"] * step:
        return []
    r = next(x for x in ranks if x.rank == name)
    held, points = consistency(w.busy, name)
    if points >= MIN_POINTS and held < t["consistency"]:
        return [_inconsistent(name, late, step, held, points)]
    phases = {x.rank: host_phase_per_step(x) for x in ranks}
    grew = {p: v - statistics.median(phases[k].get(p, 0.0) for k in others) for p, v in phases[name].items()}
    phase = max(grew, key=grew.get)
    located = grew[phase] >= 0.3 * late
    steps = statistics.median(x.step_count for x in ranks)
    lost = sum(coll[k] - coll[name] for k in others) * steps
    share = late / step
    found = causes(w, r)
    where = (f"its host time grew most in {phase.replace('_', ' ')} (+{fmt.secs(grew[phase])} per step)" if located
             else "no host-timed phase of it grew by as much (its extra time is GPU work, which runs ahead of the "
                  "host: compare its kernels with another rank's in a profiler trace)")
    arrived = (f"it had the least collective time (arrived last) at {fmt.pct(held, 0)} of {count(points, 'point')} in time"
               if points else "too few points in time to say how often it arrived last")
    table = "; ".join(f"rank {k}: {fmt.secs(v)}" for k, v in coll.items())
    return [Finding(
        rule="straggler",
        title=f"rank {name} on {r.host} is a straggler: the other ranks wait {fmt.secs(late)} per step for it "
              f"in NCCL collectives" + (f" ({phase.replace('_', ' ')} grew)" if located else ""),
        severity=severity_for(share, sev["warning_share"], sev["critical_share"]),
        confidence="high" if points >= MIN_POINTS else "medium",
        seen=f"GPU-timed collective time per step (mean step {fmt.secs(step)}, median over ranks): {table}. Rank {name} spends "
             f"{fmt.secs(late)} less per step in collectives than the others' median: they start them and wait for "
             f"it; {arrived}; {where}. {OVERLAP_NOTE}"
             + (f"; on its node: {'; '.join(found)}" if found else "; no hardware anomaly seen on its node"),
        why=f"the other {fmt.count(len(others), 'rank')} wait{'s' if len(others) == 1 else ''} for it in every "
            f"collective: about {fmt.gpu_time(lost, w.unit)} "
            f"({fmt.pct(share)} of the mean step)",
        action=action(name, r.host, phase if located else "gpu", found),
        lost_s=lost, lost_share=share,
        basis="GPU-timed collective time per step (NCCL Flight Recorder): each other rank's excess over the least "
              "(the last arriver's), x steps; a collective's GPU time includes waiting for the last rank. Exact when "
              "collectives do not overlap compute; an upper bound when they do",
        where={"ranks": [name], "nodes": [r.host]},
        evidence={"lateness_s": round(late, 6), "collective_basis": "gpu", "arrived_last_share": round(held, 3),
                  "points": points, "mean_step_s": round(step, 6),
                  "collective_per_step_s": {k: round(v, 6) for k, v in coll.items()},
                  "phase": phase if located else None, "growth_by_phase_s": {k: round(v, 6) for k, v in grew.items()},
                  "candidate_causes": found},
    )]


def _inconsistent(name: str, late: float, step: float, held: float, points: int) -> Finding:
    return Finding(
        rule="straggler",
        title=f"no consistent straggler: rank {name} has the least NCCL collective time on average "
              f"({fmt.secs(late)} per step less) but only at {fmt.pct(held, 0)} of the window's points in time",
        severity="info", confidence="medium",
        seen=f"rank {name}'s GPU-timed collective time per step is {fmt.secs(late)} below the others' median "
             f"({fmt.pct(late / step if step else 0.0)} of the step) over the window, yet it arrives last at only "
             f"{fmt.pct(held, 0)} of {count(points, 'point')} in time",
        why="a rank that holds the others back arrives last all the time; one that changes is noise",
        action="nothing to fix on one rank; if the step time matters, look at the communication finding",
        basis="GPU-timed collective time per step per rank over time; the straggler must have the least at most points",
        where={"ranks": [name]},
        evidence={"lateness_s": round(late, 6), "consistency": round(held, 3), "points": points,
                  "collective_basis": "gpu"})


def comm(w: Window, th: Thresholds, ranks: list[RankStats], link, action, bound) -> list[Finding]:
    """Communication itself (the last arriver's GPU collective time per step), by kind, against the step."""
    t = th["comm"]
    least = min(ranks, key=per_step)
    floor = per_step(least)
    step = statistics.median(r.mean_step_s for r in ranks)
    share = floor / step if step > 0 else 0.0
    if share < t["wait_share_warning"]:
        return []
    kinds = {k: v / least.step_count for k, v in least.collective_by_kind.items()}
    waits = {r.rank: per_step(r) - floor for r in ranks}
    busy, link_text = link(w)
    kind, space, tell = bound(busy, t)
    p = w.profile
    zero = p.uses_zero() if p is not None and p.training_s > 0 else \
        kinds.get("all_gather", 0.0) >= 0.3 * floor and kinds.get("reduce_scatter", 0.0) > 0
    top = sorted(kinds.items(), key=lambda kv: -kv[1])[:4]
    parts = ", ".join(f"{ZERO_WORDS.get(k, k.replace('_', '-')) if zero else k.replace('_', '-')} {fmt.secs(v)}"
                      for k, v in top)
    steps = statistics.median(r.step_count for r in ranks)
    upper = floor * steps * len(ranks)
    functions = ""
    if p is not None and p.training_s > 0:
        functions = "; where, from profiles: " + ", ".join(f"{fn} {fmt.pct(v)}" for fn, v in p.top_comm(4))
    what = "ZeRO-3 communication" if zero else "communication"
    return [Finding(
        rule="comm",
        title=f"{what} takes {fmt.pct(share)} of each step on the GPU (NCCL, stragglers' waits taken out)"
              + (f" ({kind}-bound)" if kind != "unknown" else ""),
        severity="warning", confidence="medium",   # exposure not measured: an upper bound, at most a warning
        seen=f"the last-arriving rank {least.rank}'s NCCL collectives take {fmt.secs(floor)} of a {fmt.secs(step)} "
             f"step on the GPU ({parts}); the other ranks wait beyond that up to "
             f"{fmt.secs(max(waits.values()))} per step for stragglers (the straggler rule); exposure {EXPOSURE}"
             f"{functions}; {link_text}",
        why=f"communication the compute does not hide stalls every rank: up to {fmt.gpu_time(upper, w.unit)} in the window "
            f"(all of it if nothing overlaps)",
        action=action(zero, kind, space, tell), lost_s=upper, lost_share=share,
        basis="GPU-timed collective time per step of the rank with the least (the last arriver: no waiting for "
              "others in it) x steps x ranks; an upper bound, as overlap with compute is not measured",
        where={"ranks": sorted((r.rank for r in ranks), key=lambda x: (int(x) if x.isdigit() else 1 << 30, x))},
        evidence={"collective_basis": "gpu", "comm_share": round(share, 4), "comm_per_step_s": round(floor, 6),
                  "mean_step_s": round(step, 6), "by_kind_s": {k: round(v, 6) for k, v in kinds.items()},
                  "exposed": None, "exposure": "not measured", "link_busy": busy, "bound": kind, "zero": zero,
                  "wait_beyond_per_rank_s": {k: round(v, 6) for k, v in waits.items()}},
        tune_space=space if zero else None,
    )]
