"""Communication-bound: ranks waiting in collectives and ZeRO parameter fetches (from profiles),
with interconnect throughput against its link limit telling latency- from bandwidth-bound."""
from __future__ import annotations

import statistics

from . import fmt, gpu_waits
from .findings import Finding, missing_input, severity_for
from .thresholds import Thresholds
from .model import Window

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


def _measured(w: Window) -> tuple[float, float, dict[str, float]] | None:
    """(seconds per step every rank waits in collectives, mean step seconds (median over ranks), seconds per step by kind of
    the least-waiting rank) when every rank reports its collective wait; else None."""
    ranks = [r for r in w.ranks if r.step_count > 0 and r.mean_step_s]
    if not ranks or any(r.collective_s is None for r in ranks):
        return None
    least = min(ranks, key=lambda r: r.collective_s / r.step_count)
    floor = least.collective_s / least.step_count
    step = statistics.median(r.mean_step_s for r in ranks)
    return floor, step, {k: v / least.step_count for k, v in least.collective_by_kind.items()}


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
    m = _measured(w)
    if m is None:
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
    floor, step, kinds = m
    share = floor / step if step > 0 else 0.0
    if share < t["wait_share_warning"]:
        return []
    busy, link_text = _link(w)
    zero = p.uses_zero() if p is not None and p.training_s > 0 else kinds.get("all_gather", 0.0) >= 0.3 * floor
    kind, space, tell = _bound(busy, t)
    n = len([r for r in w.ranks if r.step_count > 0])
    steps = statistics.median(r.step_count for r in w.ranks if r.step_count > 0)
    lost = floor * steps * n
    top = sorted(kinds.items(), key=lambda kv: -kv[1])[:4]
    functions = ""
    if p is not None and p.training_s > 0:
        functions = "; where, from profiles: " + ", ".join(f"{fn} {fmt.pct(v)}" for fn, v in p.top_comm(4))
    what = "ZeRO-3 communication wait" if zero else "communication wait"
    return [Finding(
        rule="comm",
        title=f"{what}: every rank is blocked in collectives {fmt.pct(share)} of step time"
              + (f" ({kind}-bound)" if kind != "unknown" else ""),
        severity=severity_for(share, t["wait_share_warning"], t["wait_share_critical"]),
        confidence="high" if busy is not None else "medium",
        seen=f"the least-waiting rank is blocked {fmt.secs(floor)} of a {fmt.secs(step)} step in collectives ("
             + ", ".join(f"{k.replace('_', '-')} {fmt.secs(v)}" for k, v in top) + f"){functions}; {link_text}"
             + (f"; {profile_note}" if profile_note else ""),
        why=f"ranks wait instead of computing: about {fmt.gpu_time(lost, w.unit)}; overlapping communication with "
            f"compute or moving fewer bytes recovers part of it",
        action=_action(zero, kind, space, tell), lost_s=lost, lost_share=share,
        basis="the least collective wait per step of any rank (what every rank waits; waits beyond it are "
              "imbalance, see the straggler rule) x steps x ranks",
        where={"ranks": sorted({r.rank for r in w.ranks if r.step_count > 0}, key=_rank_order)},
        evidence={"wait_share": round(share, 4), "wait_per_step_s": round(floor, 6), "mean_step_s": round(step, 6),
                  "by_kind_s": {k: round(v, 6) for k, v in kinds.items()}, "link_busy": busy, "bound": kind,
                  "zero": zero, "profile_source": p.source if p is not None else None,
                  "top_functions": dict((fn, round(v, 4)) for fn, v in p.top_comm(4)) if p is not None else {}},
        tune_space=space if zero else None,
    )]


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
