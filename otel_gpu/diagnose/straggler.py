"""Stragglers: the rank that arrives late at the step's synchronisation point.

In synchronous training every rank's step takes as long as the slowest one: the others wait
in the collective. So step times alone do not name the straggler; where the time goes does.
Within a step, phases run in order (data_wait, forward, backward, optimizer, then anything
else). The straggler is late at some phase boundary: its cumulative per-step time up to that
phase exceeds the earliest rank's; the waiting ranks absorb that lateness later, inside the
phase that holds the collective. Lateness = max over boundaries of (cumulative time - the
earliest rank's). Unsynchronised ranks show it at the last boundary (their step time).
"""
from __future__ import annotations

import statistics

from . import fmt
from .findings import Finding, severity_for
from .thresholds import Thresholds
from .window import RankStats, Window

STEP_ORDER = ("data_wait", "forward", "backward", "optimizer")
OUTSIDE_STEP = ("checkpoint", "eval")   # not per step; their own rules


def phase_order(ranks: list[RankStats]) -> list[str]:
    seen = {p for r in ranks for p in r.phases if p not in OUTSIDE_STEP}
    return [p for p in STEP_ORDER if p in seen] + sorted(seen - set(STEP_ORDER))


def lateness(ranks: list[RankStats]) -> dict[str, tuple[float, str]]:
    """rank -> (seconds late per step, the phase boundary where it is latest)."""
    order = phase_order(ranks)
    per_step: dict[str, list[float]] = {}
    for r in ranks:
        times = [r.phases.get(p, 0.0) / r.step_count for p in order]
        rest = max(0.0, (r.mean_step_s or 0.0) - sum(times))
        per_step[r.rank] = times + [rest]
    bounds = order + ["end of step"]
    cum = {k: [sum(v[: i + 1]) for i in range(len(v))] for k, v in per_step.items()}
    earliest = [min(c[i] for c in cum.values()) for i in range(len(bounds))]
    out = {}
    for k, c in cum.items():
        late = [c[i] - earliest[i] for i in range(len(bounds))]
        i = max(range(len(bounds)), key=late.__getitem__)
        out[k] = (late[i], bounds[i])
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
    """Name the rank (and node) that the others wait for, with candidate causes on its node."""
    t, sev = th["straggler"], th["severity"]
    ranks = [r for r in w.ranks if r.step_count > 0 and r.mean_step_s]
    if len(ranks) < 2:
        return []
    late = lateness(ranks)
    step = statistics.median(r.mean_step_s for r in ranks)
    name, (secs, where) = max(late.items(), key=lambda kv: kv[1][0])
    if secs < t["lateness_min_s"] or secs < t["lateness_share"] * step:
        return []
    r = next(x for x in ranks if x.rank == name)
    steps = statistics.median(x.step_count for x in ranks)
    lost = secs * steps * (len(ranks) - 1)
    share = secs / step
    skew = max(x.mean_step_s for x in ranks) / min(x.mean_step_s for x in ranks) - 1
    causes = _causes(w, r)
    second = sorted(v[0] for k, v in late.items() if k != name)[-1]
    return [Finding(
        rule="straggler",
        title=f"rank {name} on {r.host} is a straggler: {fmt.secs(secs)} late every step",
        severity=severity_for(share, sev["warning_share"], sev["critical_share"]),
        confidence="high" if secs > 3 * second else "medium",
        seen=f"rank {name} reaches the {where} boundary {fmt.secs(secs)} per step after the earliest rank "
             f"(median step {fmt.secs(step)}; next-latest rank {fmt.secs(second)}); step-time skew across ranks "
             f"{fmt.pct(skew)}" + (f"; on its node: {'; '.join(causes)}" if causes else "; no hardware anomaly seen on its node"),
        why=f"the other {len(ranks) - 1} rank(s) wait for it in every collective: about {fmt.gpu_time(lost)} "
            f"({fmt.pct(share)} of step time)",
        action=("check the candidate causes on " + r.host + "; " if causes else "")
               + f"compare rank {name}'s data shard and input pipeline with the others, and its GPU in a "
                 f"profiler trace (`otel-gpu trace analyze`); if the node is at fault, drain it and restart "
                 f"from the last checkpoint",
        lost_s=lost, lost_share=share,
        basis="per-step lateness x steps x the other ranks (they wait for it)",
        where={"ranks": [name], "nodes": [r.host]},
        evidence={"lateness_s": round(secs, 6), "boundary": where, "median_step_s": round(step, 6),
                  "step_skew": round(skew, 4), "per_rank_lateness_s": {k: round(v[0], 6) for k, v in late.items()},
                  "candidate_causes": causes},
    )]
