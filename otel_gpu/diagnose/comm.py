"""Communication-bound: ranks waiting in collectives and ZeRO parameter fetches (from profiles),
with interconnect throughput against its link limit telling latency- from bandwidth-bound.

A rank's collective wait is measured wherever it blocks while a phase is open, between steps too (the
HF Trainer's token-count all-gather in its batch fetch), and anywhere inside a step: so its share is
taken of the rank's wall time in the window (steps and the time between them), never of step time
alone. ZeRO-3 is named only on evidence of it: ZeRO-3's fetch and partition functions in the
profiles, or (without profiles) all-gathers waited inside forward/backward, a sharded model's
parameter fetch; any other all-gather (a batch's token count, a metric) is generic communication."""
from __future__ import annotations

import statistics
from typing import NamedTuple

from .. import names as N
from . import fmt, gpu_waits
from .findings import Finding, missing_input, severity_for
from .thresholds import Thresholds
from .model import RankStats, Window

# Suggested `otel-gpu tune --space` files (its format: short names for the ZeRO-3 knobs it knows,
# dotted config paths for others, false drops a knob). Latency-bound: fewer, larger collectives.
LATENCY_SPACE = {"params": {
    "reduce_bucket_size": {"low": 50_000_000, "high": 1_000_000_000},
    "stage3_prefetch_bucket_size": {"low": 5_000_000, "high": 1_000_000_000},
    "stage3_param_persistence_threshold": {"low": 10_000, "high": 10_000_000},
    "stage3_max_live_parameters": {"low": 100_000_000, "high": 10_000_000_000},
    "overlap_comm": {"choices": [True, False]},
    "sub_group_size": False,
}}
# Bandwidth-bound: move fewer bytes (keep small parameters resident, gather within the node, quantize).
BANDWIDTH_SPACE = {"params": {
    "stage3_param_persistence_threshold": {"low": 100_000, "high": 100_000_000},
    "stage3_max_reuse_distance": {"low": 100_000_000, "high": 10_000_000_000},
    "stage3_max_live_parameters": {"low": 100_000_000, "high": 10_000_000_000},
    "zero_optimization.zero_hpz_partition_size": {"choices": [1, 2, 4, 8]},
    "zero_optimization.zero_quantized_weights": {"choices": [False, True]},
    "train_micro_batch_size_per_gpu": {"choices": [1, 2, 4, 8]},
    "sub_group_size": False,
}}


def _link(w: Window) -> tuple[float | None, str]:
    """Interconnect use over its limit (the busiest node), and a sentence saying so."""
    nodes = [n for n in w.nodes if n.link_Bps is not None and n.link_limit_Bps]
    if not nodes:
        return None, "interconnect throughput not measured"
    n = max(nodes, key=lambda x: x.link_Bps / x.link_limit_Bps)
    busy = n.link_Bps / n.link_limit_Bps
    peak = ""
    ib = [v for v in (w.timeline.get("ib") or []) if v is not None]
    if ib and n.link_kind == "infiniband":
        peak = f", peak {fmt.rate(max(ib))}"
    return busy, (f"{n.link_kind} at {fmt.rate(n.link_Bps)} of {fmt.rate(n.link_limit_Bps)} per direction "
                  f"on {n.host} ({fmt.pct(busy)}{peak})")


def waits_beside_saves(ranks: list[RankStats]) -> dict[str, float]:
    """rank -> seconds of collective wait that are not the time a slower saver kept it waiting: its wait
    minus (the slowest rank's checkpoint seconds - its own), at least 0. In synchronous training a rank
    that saves less waits for the slowest saver in its next collective (a barrier, the Trainer's
    token-count all-gather): that wait is the checkpoint rule's cost, not communication."""
    top = max((r.phases.get("checkpoint", 0.0) for r in ranks), default=0.0)
    return {r.rank: max(0.0, r.collective_s - (top - r.phases.get("checkpoint", 0.0))) for r in ranks}


def measured_on_s(w: Window, r: RankStats) -> float:
    """Seconds rank `r`'s collective waits were measured on: its wall time in the window (its steps and the
    time between them, where a batch fetch, a save or logging can wait too), less evaluation (eval's own
    time and its waits: the eval rule's, never in `collective_s`)."""
    ev = sum(r.phases.get(p, 0.0) + r.collective_by_phase.get(p, 0.0) for p in N.OUTSIDE_STEPS)
    return max(0.0, w.rank_wall_s(r) - ev)


class Measured(NamedTuple):
    """What every rank waits, from the least-waiting rank (by share of its measured time); seconds."""
    rank: RankStats
    share: float            # its collective wait over the time it was measured on
    wait_s: float           # its collective wait in the window, waits for slower savers left out
    basis_s: float          # the time that wait was measured on (`measured_on_s`)
    step_s: float           # mean step time, median over ranks
    by_kind_s: dict[str, float]   # its wait by kind (scaled like `wait_s`)


def _measured(w: Window) -> tuple[Measured, list[RankStats]] | None:
    """The least wait share of any rank, with the ranks it was taken over, when every rank reports its
    collective wait; else None. Waits for slower savers are left out (`waits_beside_saves`)."""
    ranks = [r for r in w.ranks if r.step_count > 0 and r.mean_step_s]
    if not ranks or any(r.collective_s is None for r in ranks):
        return None
    ranks = [r for r in ranks if measured_on_s(w, r) > 0]
    if not ranks:
        return None
    waits = waits_beside_saves(ranks)
    least = min(ranks, key=lambda r: waits[r.rank] / measured_on_s(w, r))
    wait, basis = waits[least.rank], measured_on_s(w, least)
    scale = wait / least.collective_s if least.collective_s > 0 else 0.0
    step = statistics.median(r.mean_step_s for r in ranks)
    kinds = {k: v * scale for k, v in least.collective_by_kind.items()}
    return Measured(least, wait / basis, wait, basis, step, kinds), ranks


def is_zero3(w: Window) -> tuple[bool, str]:
    """(the job is a ZeRO-3 job, the evidence in words): ZeRO-3's functions in the training threads' profile
    samples when profiles were read, else all-gathers waited inside forward/backward (parameter fetch) at
    least 10% of the ranks' collective wait (with small buckets ZeRO-3's gradient reduce-scatters take most
    of it: 23% fetch measured on a CPU run). An all-gather elsewhere (a batch's token count) is not it."""
    p = w.profile
    if p is not None and p.training_s > 0:
        return (True, "ZeRO-3 fetch/partition functions in the profiles") if p.uses_zero() else \
            (False, "no ZeRO-3 function in the profiles")
    ranks = [r for r in w.ranks if r.collective_s]
    fetch, total = sum(r.param_gather_s for r in ranks), sum(r.collective_s for r in ranks)
    if total > 0 and fetch >= 0.1 * total:
        return True, f"all-gathers inside forward/backward (parameter fetch) are {fmt.pct(fetch / total)} of the wait"
    return False, ""


def _not_checked(w: Window, why: list[str]) -> Finding:
    needs = ("the ranks ran under `otel-gpu run` and reported no collective wait: no torch.distributed collectives "
             "were seen" if w.source == "recording" else
             "needs each rank's collective wait (`otel-gpu run` / `opentelemetry-instrument` on a "
             "torch.distributed job) or profiles (`--pyroscope URL`)")
    return missing_input("comm", "Communication-bound (collectives, ZeRO fetches)", needs, why)


def comm_bound(w: Window, th: Thresholds) -> list[Finding]:
    """Time every rank spends blocked in collectives (the least-waiting rank's wait: what is not
    imbalance), with the functions from profiles where present and the link use telling latency- from
    bandwidth-bound."""
    t = th["comm"]
    p = w.profile
    profile_note = (f"profiles not checked: {w.profile_error}" if w.profile_error else
                    "profiles not read (pass --pyroscope URL for the waiting functions)" if p is None else "")
    ranks = [r for r in w.ranks if r.step_count > 0 and r.mean_step_s]
    bases = {r.collective_basis or "host" for r in ranks if r.collective_s is not None}
    if ranks and all(r.collective_s is not None for r in ranks):
        if len(bases) > 1 or "mixed" in bases:
            return [gpu_waits.mixed_bases("comm", "Communication-bound (collectives, ZeRO fetches)", ranks)]
        if bases == {"gpu"}:
            return gpu_waits.comm(w, th, ranks, _link, _action, _bound)
    measured = _measured(w)
    if measured is None:
        if p is None or p.training_s <= 0:
            lacking = [r for r in ranks if r.collective_s is None]
            if lacking and any(r.collective_unmeasured for r in lacking):
                return [missing_input("comm", "Communication-bound (collectives, ZeRO fetches)",
                                      "needs each rank's collective time" + gpu_waits.why_unmeasured(lacking)
                                      + "; or profiles (`--pyroscope URL`)", ["collective-wait metric"])]
            why = ["collective-wait metric"] + ([w.profile_error] if w.profile_error else ["profiles"] if p is None
                                                else ["training-thread profile samples"])
            return [_not_checked(w, why)]
        return _from_profile(w, th)
    m, ranks = measured
    if m.share < t["wait_share_warning"]:
        return []
    contended = _cpu_contention(w, t)
    busy, link_text = _link(w)
    zero, zero_why = is_zero3(w)
    kind, space, tell = _bound(busy, t)
    lost = m.share * sum(measured_on_s(w, r) for r in ranks)
    n = m.rank.step_count
    top = sorted(m.by_kind_s.items(), key=lambda kv: -kv[1])[:4]
    functions = ""
    if p is not None and p.training_s > 0:
        functions = "; where, from profiles: " + ", ".join(f"{fn} {fmt.pct(v)}" for fn, v in p.top_comm(4))
    what = ("ZeRO-3 communication wait" if zero else
            "communication wait (" + ", ".join(k.replace("_", "-") for k, _ in top[:2]) + ")" if top else "communication wait")
    return [Finding(
        rule="comm",
        title=f"{what}: every rank is blocked in collectives {fmt.pct(m.share)} of its time"
              + (f" ({kind}-bound)" if kind != "unknown" else "")
              + (" while other processes kept the node's CPUs busy" if contended else ""),
        severity="info" if contended else severity_for(m.share, t["wait_share_warning"], t["wait_share_critical"]),
        confidence="low" if contended else "high" if busy is not None else "medium",
        seen=f"the least-waiting rank (rank {m.rank.rank}) is blocked {fmt.secs(m.wait_s / n)} per step in collectives ("
             + ", ".join(f"{k.replace('_', '-')} {fmt.secs(v / n)}" for k, v in top)
             + f") of its {fmt.secs(m.basis_s / n)} of wall time per step (steps of {fmt.secs(m.step_s)}, median over "
             f"ranks, and the time between them, where waits are measured too)"
             + (f"; ZeRO-3: {zero_why}" if zero else "") + f"{functions}; {link_text}"
             + (f"; {profile_note}" if profile_note else "")
             + (f"; {contended}: a rank waiting for a CPU keeps the others waiting in their collectives, so this "
                f"wait may be CPU contention rather than communication" if contended else ""),
        why=f"ranks wait instead of computing: about {fmt.gpu_time(lost, w.unit)}; overlapping communication with "
            f"compute or moving fewer bytes recovers part of it",
        action=("free the node's CPUs (or pin the ranks to their own cores) and measure again before tuning "
                "communication; then: " if contended else "") + _action(zero, kind, space, tell),
        lost_s=lost, lost_share=m.share,
        basis="the least collective wait share of any rank (what every rank waits; waits beyond it are imbalance, see "
              "the straggler rule; waits for a slower saver are the checkpoint rule's), of its wall time outside "
              "evaluation, x each rank's wall time outside evaluation",
        where={"ranks": sorted({r.rank for r in w.ranks if r.step_count > 0}, key=_rank_order)},
        evidence={"wait_share": round(m.share, 4), "wait_per_step_s": round(m.wait_s / n, 6),
                  "wall_per_step_s": round(m.basis_s / n, 6), "mean_step_s": round(m.step_s, 6),
                  "least_rank": m.rank.rank, "by_kind_s": {k: round(v / n, 6) for k, v in m.by_kind_s.items()},
                  "link_busy": busy, "bound": kind, "zero": zero, "zero_evidence": zero_why,
                  "cpu_contention": contended or None,
                  "profile_source": p.source if p is not None else None,
                  "top_functions": dict((fn, round(v, 4)) for fn, v in p.top_comm(4)) if p is not None else {}},
        tune_space=space if zero else None,
    )]


def _cpu_contention(w: Window, t) -> str:
    """What says a node's CPUs were taken by processes outside the job (busy at least ``cpu_contended``,
    at least ``cpu_others`` of them not the job's), or "" (also where the job's own CPU was not read)."""
    for n in w.nodes:
        others = n.others_cpu
        if others is not None and n.cpu_busy >= t["cpu_contended"] and others >= t["cpu_others"]:
            return (f"{n.host}'s CPUs were {fmt.pct(n.cpu_busy)} busy, {fmt.pct(others)} of them other processes' "
                    f"(the job's used {n.job_cpu:.2f} of {n.cpus:.0f})")
    return ""


def _rank_order(r: str):
    return (int(r) if r.isdigit() else 1 << 30, r)


def _bound(busy: float | None, t) -> tuple[str, dict, str]:
    if busy is None:
        return ("unknown", LATENCY_SPACE,
                "without interconnect metrics latency- and bandwidth-bound cannot be told apart; ")
    if busy >= t["link_busy"]:
        return "bandwidth", BANDWIDTH_SPACE, "the link is near its limit: move fewer bytes; "
    return "latency", LATENCY_SPACE, "the link has headroom: fewer, larger transfers; "


def _action(zero: bool, kind: str, space: dict, tell: str) -> str:
    if not zero:
        return (f"{tell}larger gradient buckets (DDP bucket_cap_mb), overlap communication with compute, "
                f"fewer synchronisations (gradient accumulation with no_sync)")
    keys = ", ".join(k.split(".")[-1] for k, v in space["params"].items() if v is not False)
    how = ("`otel-gpu tune --base-config ds.json --space space.json --command '...{config}...'` with the "
           "suggested space (`otel-gpu diagnose --tune-space space.json` writes it)")
    if kind == "bandwidth":
        return (f"{tell}tune ZeRO-3 over {keys} (hpZ keeps gathers inside the node, quantized weights halve "
                f"the bytes): {how}")
    return f"{tell}tune ZeRO-3 over {keys}: {how}"


def _from_profile(w: Window, th: Thresholds) -> list[Finding]:
    """Without the collective-wait metric: the communication share of training-thread profile samples."""
    t = th["comm"]
    p = w.profile
    share = p.comm_share()
    if share < t["wait_share_warning"]:
        return []
    busy, link_text = _link(w)
    zero = p.uses_zero()
    kind, space, tell = _bound(busy, t)
    per_group = {k: g.comm_s / g.training_s for k, g in p.groups.items() if g.training_s > 0}
    walls = [w.rank_wall_s(r) for r in w.ranks]
    base = sum(walls) if walls and sum(walls) > 0 else p.training_s
    lost = share * base
    what = "ZeRO-3 communication wait" if zero else "communication wait"
    return [Finding(
        rule="comm",
        title=f"{what}: {fmt.pct(share)} of training-thread samples in communication functions"
              + (f" ({kind}-bound)" if kind != "unknown" else ""),
        severity=severity_for(share, t["wait_share_warning"], t["wait_share_critical"]),
        confidence="low",
        seen=f"{fmt.pct(share)} of the profile samples of training threads (phase-tagged, or inside a "
             f"communication function) are inside communication functions "
             f"({', '.join(f'{fn} {fmt.pct(v)}' for fn, v in p.top_comm(4))}); {link_text}; the ranks' collective "
             f"wait was not measured, so imbalance (a straggler) cannot be told from communication cost",
        why=f"ranks wait instead of computing: up to {fmt.gpu_time(lost, w.unit)} of {fmt.gpu_time(base, w.unit)}",
        action=_action(zero, kind, space, tell), lost_s=lost, lost_share=share,
        basis="communication share of training-thread profile samples (all ranks together) x the ranks' wall time; "
              "includes waits caused by stragglers",
        where={p.group_label + "s": sorted(per_group)} if per_group else {},
        evidence={"wait_share": round(share, 4), "top_functions": dict((fn, round(v, 4)) for fn, v in p.top_comm(4)),
                  "link_busy": busy, "bound": kind, "zero": zero, "profile_source": p.source,
                  "per_group_share": {k: round(v, 4) for k, v in per_group.items()}},
        tune_space=space if zero else None,
    )]
