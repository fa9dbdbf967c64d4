"""Stragglers: the rank the others wait for, named from measured waits.

In synchronous training every rank's step takes as long as the slowest one: the others wait in
collectives. Each rank reports the seconds it was blocked in collectives inside its steps
(`otelgpu.train.collective.time`). Per step, a rank's *busy* time is its step time minus that
wait, minus checkpoint and eval time (their own rules). The straggler is the rank with the most
busy time: its extra busy time (over the median of the others) is what the others wait for,
wherever in the step it falls. Its busy time per phase (the phase's own time: a collective inside a
phase is counted as wait, not as the phase's time; what no phase covers is "unphased") against the
others' says which part of its step grew. So a rank that waits for another inside its batch fetch
or its logging (a token-count all-gather, a metric all-reduce) is never the one named.
"""
from __future__ import annotations

import statistics

from .. import names as N
from ..words import count, noun
from . import fmt, gpu_waits, health
from .findings import Finding, missing_input, severity_for
from .thresholds import Thresholds
from .model import RankStats, Window

OUTSIDE_STEP = ("checkpoint", "eval")   # not part of the per-step comparison: their own rules
UNPHASED = "unphased"
MIN_POINTS = 3   # points in time needed to judge whether the same rank stays the busiest
CAUSE = {"data_wait": "input (its own data loading)", "forward": "forward", "backward": "backward",
         "optimizer": "optimizer", UNPHASED: "time outside any phase (its own code between or around the steps)"}


def busy_per_step(r: RankStats) -> dict[str, float]:
    """Seconds per step this rank was not waiting for peers, per phase (+ "unphased"); checkpoint
    and eval left out. A phase's seconds are its own time: the collective waits inside it are not in
    them (the training side takes them out), so every wait is taken out of the step once, wherever
    it happened. Needs `r.collective_s` and `r.step_count`."""
    n = r.step_count
    out = {p: s / n for p, s in r.phases.items() if p not in OUTSIDE_STEP}
    waited = sum(v for p, v in r.collective_by_phase.items() if p not in N.OUTSIDE_STEPS)
    step = (r.step_time_s - waited - sum(r.phases.get(p, 0.0) for p in OUTSIDE_STEP if p not in N.OUTSIDE_STEPS)) / n
    out[UNPHASED] = max(0.0, step - sum(out.values()))
    return out


def _causes(w: Window, r: RankStats) -> list[str]:
    """What on the straggler's node differs from the rest of the job."""
    out = []
    gpus = [g for g in w.gpus if r.rank in g.ranks] or w.gpus_of(r.host)
    others = [g for g in w.gpus if g not in gpus]
    clocks = [g.clock_hz for g in others if g.clock_hz]
    temps = [g.temp_c for g in others if g.temp_c is not None]
    for g in gpus:
        if g.clock_hz and clocks:
            ref = statistics.median(clocks)
            if g.clock_hz < 0.97 * ref:
                out.append(f"{g.name} SM clock {g.clock_hz / 1e6:.0f} MHz vs {ref / 1e6:.0f} MHz elsewhere")
        active = {k: v for k, v in g.throttle.items() if v >= 0.05}
        if active:
            out.append(f"{g.name} throttled ({', '.join(f'{k} {fmt.pct(v, 0)}' for k, v in active.items())})")
        if g.temp_c is not None and temps and g.temp_c > statistics.median(temps) + 8:
            out.append(f"{g.name} at {g.temp_c:.0f} C vs {statistics.median(temps):.0f} C elsewhere")
    gc_pause = health.gc_cause(w.ranks, r)
    if gc_pause:
        out.append(gc_pause)
    node = w.node(r.host)
    if node is not None:
        if node.nic_errors:
            out.append(f"{node.nic_errors:.0f} NIC errors on {node.host}")
        if node.ib_errors:
            out.append(f"{node.ib_errors:.0f} InfiniBand port errors on {node.host}")
        others_cpu = [n.cpu_busy for n in w.nodes if n.host != node.host and n.cpu_busy is not None]
        if node.cpu_busy is not None and others_cpu and node.cpu_busy > statistics.median(others_cpu) + 0.2:
            out.append(f"CPU {fmt.pct(node.cpu_busy)} busy on {node.host} vs {fmt.pct(statistics.median(others_cpu))} elsewhere")
    return out


def straggler(w: Window, th: Thresholds) -> list[Finding]:
    """Name the rank the others wait for (the most busy time per step), with the phase that grew and
    candidate causes on its node."""
    t, sev = th["straggler"], th["severity"]
    ranks = [r for r in w.ranks if r.step_count > 0 and r.mean_step_s]
    if len(ranks) < 2:
        return []
    unmeasured = [r for r in ranks if r.collective_s is None]
    if unmeasured:
        return [missing_input(
            "straggler", "Stragglers",
            "needs each rank's time in collectives (otelgpu.train.collective.time): "
            + ("the ranks ran under `otel-gpu run` and reported none: no torch.distributed collectives were seen "
               if w.source == "recording" else
               "run the job under `otel-gpu run` or `opentelemetry-instrument`, or import otel_gpu.training before "
               "the loop ")
            + f"(missing for {noun(len(unmeasured), 'rank')} {fmt.compact([r.rank for r in unmeasured])}"
            + f"{gpu_waits.why_unmeasured(unmeasured)})",
            ["collective-wait metric"])]
    bases = {r.collective_basis or "host" for r in ranks}
    if len(bases) > 1 or "mixed" in bases:
        return [gpu_waits.mixed_bases("straggler", "Stragglers", ranks)]
    if bases == {"gpu"}:
        return gpu_waits.straggler(w, th, ranks, consistency, _causes, _action)
    busy = {r.rank: busy_per_step(r) for r in ranks}
    total = {k: sum(v.values()) for k, v in busy.items()}
    wait = {r.rank: r.collective_s / r.step_count for r in ranks}
    name = max(total, key=total.get)
    others = [k for k in total if k != name]
    ref = statistics.median(total[k] for k in others)
    late = total[name] - ref
    step = statistics.median(r.mean_step_s for r in ranks)
    if late < t["lateness_min_s"] or late < t["lateness_share"] * step:
        return []
    r = next(x for x in ranks if x.rank == name)
    held, points = consistency(w.busy, name)
    if points >= MIN_POINTS and held < th["straggler"]["consistency"]:
        return [_inconsistent(name, late, step, held, points)]
    waited = statistics.median(wait[k] for k in others) - wait[name]   # what the others wait more than it
    grew = {p: v - statistics.median(busy[k].get(p, 0.0) for k in others) for p, v in busy[name].items()}
    phase = max(grew, key=grew.get)
    steps = statistics.median(x.step_count for x in ranks)
    lost = late * steps * len(others)
    share = late / step
    causes = _causes(w, r)
    consistent = waited >= 0.5 * late
    per_rank = {k: {"busy_s": round(total[k], 6), "collective_wait_s": round(wait[k], 6)} for k in total}
    table = "; ".join(f"rank {k}: busy {fmt.secs(total[k])}, waiting {fmt.secs(wait[k])}" for k in total)
    return [Finding(
        rule="straggler",
        title=f"rank {name} on {r.host} is a straggler: {fmt.secs(grew[phase])} more per step in "
              f"{CAUSE.get(phase, phase)}; the others wait {fmt.secs(late)} per step for it",
        severity=severity_for(share, sev["warning_share"], sev["critical_share"]),
        confidence="high" if consistent and points >= MIN_POINTS else "medium",
        seen=f"per step (mean step {fmt.secs(step)}, median over ranks): {table}. Rank {name} is busy {fmt.secs(late)} longer than the "
             f"others and waits {fmt.secs(max(0.0, waited))} less in collectives; its {phase.replace('_', ' ')} time "
             f"grew by {fmt.secs(grew[phase])}"
             + (f"; on its node: {'; '.join(causes)}" if causes else "; no hardware anomaly seen on its node"),
        why=f"the other {fmt.count(len(others), 'rank')} wait{'s' if len(others) == 1 else ''} for it in every "
            f"collective: about {fmt.gpu_time(lost, w.unit)} "
            f"({fmt.pct(share)} of step time)",
        action=_gc_first(ranks, r, late, _action(name, r.host, phase, causes)),
        lost_s=lost, lost_share=share,
        basis="busy time per step (step time minus collective wait, checkpoint and eval) of the straggler over the "
              "others' median, x steps x the other ranks"
              + (f"; the busiest rank at {fmt.pct(held, 0)} of {count(points, 'point')} in time" if points else ""),
        where={"ranks": [name], "nodes": [r.host]},
        evidence={"lateness_s": round(late, 6), "phase": phase, "consistency": round(held, 3), "points": points, "phase_growth_s": round(grew[phase], 6),
                  "mean_step_s": round(step, 6), "per_rank": per_rank,
                  "growth_by_phase_s": {k: round(v, 6) for k, v in grew.items()}, "candidate_causes": causes,
                  **_gc_evidence(ranks)},
    )]


def consistency(busy: dict[str, list[float | None]], name: str) -> tuple[float, int]:
    """(share of the points in time at which rank `name` is the busiest, points with every rank's value)."""
    if name not in busy or len(busy) < 2:
        return 0.0, 0
    held = points = 0
    for i in range(min(len(v) for v in busy.values())):
        row = {k: v[i] for k, v in busy.items()}
        if any(v is None for v in row.values()):
            continue
        points += 1
        if max(row, key=row.get) == name:
            held += 1
    return (held / points if points else 0.0), points


def _inconsistent(name: str, late: float, step: float, held: float, points: int) -> Finding:
    return Finding(
        rule="straggler",
        title=f"no consistent straggler: rank {name} is busiest on average ({fmt.secs(late)} per step) but only at "
              f"{fmt.pct(held, 0)} of the window's points in time",
        severity="info", confidence="medium",
        seen=f"rank {name}'s busy time per step exceeds the others' median by {fmt.secs(late)} "
             f"({fmt.pct(late / step if step else 0.0)} of the step) over the window, yet it is the busiest rank at "
             f"only {fmt.pct(held, 0)} of {count(points, 'point')} in time",
        why="a rank that holds the others back is slower all the time; a difference that moves between ranks is "
            "noise (other processes on the hosts, uneven collectives), not one rank to fix",
        action="nothing to fix on one rank; if the step time matters, look at the communication and host findings",
        basis="busy time per step per rank over time (range query); the straggler must be the busiest rank at "
              "most points",
        where={"ranks": [name]},
        evidence={"lateness_s": round(late, 6), "consistency": round(held, 3), "points": points})


def _gc_evidence(ranks: list[RankStats]) -> dict:
    per = {r.rank: health.gc_per_step(r) for r in ranks}
    return {"gc_s_per_step": {k: round(v, 6) for k, v in per.items() if v is not None}} if any(
        v is not None for v in per.values()) else {}


def _gc_first(ranks: list[RankStats], r: RankStats, late: float, action: str) -> str:
    """The action, led by the GC advice when the straggler's extra GC time is at least half its lateness."""
    got = health.gc_excess(ranks, r)
    if got is None or got[0] - got[1] < max(health.GC_EXCESS_MIN_S, 0.5 * late):
        return action
    return f"rank {r.rank}: {health.GC_ACTION}; then: {action}"


def _action(rank: str, host: str, phase: str, causes: list[str]) -> str:
    first = {
        "data_wait": f"rank {rank}'s input pipeline is slower: check its data shard (sizes, decoding cost), its "
                     "DataLoader workers and the storage it reads from",
        "gpu": f"rank {rank}'s GPU work takes longer: compare its kernels with another rank's in profiler traces "
               "(`otel-gpu trace analyze` on both) and check its GPU's clocks, power and temperature",
        UNPHASED: f"rank {rank} runs extra code outside the training phases (logging, metrics, host syncs, "
                  "rank-0-only work): profile it (`otel-gpu run --pyroscope`) and move that work off the step",
    }.get(phase, f"compare rank {rank}'s {phase} with the others' in a profiler trace (`otel-gpu trace analyze`)")
    node = (f"; check the candidate causes on {host}" if causes else "") + \
        "; if the node is at fault, drain it and restart from the last checkpoint"
    return first + node
