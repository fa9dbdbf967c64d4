"""Communication-bound: ranks waiting in collectives and ZeRO parameter fetches (from profiles),
with interconnect throughput against its link limit telling latency- from bandwidth-bound."""
from __future__ import annotations

import statistics

from . import fmt
from .findings import Finding, missing_input, severity_for
from .thresholds import Thresholds
from .window import Window

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


def comm_bound(w: Window, th: Thresholds) -> list[Finding]:
    t = th["comm"]
    p = w.profile
    if p is None:
        return [missing_input(
            "comm", "Communication-bound (collectives, ZeRO fetches)",
            "needs continuous profiles: pass --pyroscope URL (ranks profiled with OTELGPU_PYROSCOPE_URL)",
            ["profiles"])]
    if p.training_s <= 0:
        return [missing_input(
            "comm", "Communication-bound (collectives, ZeRO fetches)",
            "profiles hold no training-thread samples in the window (phase-tagged, from otel_gpu.training)",
            ["training-thread profile samples"])]
    share = p.comm_share()
    if share < t["wait_share_warning"]:
        return []
    busy, link_text = _link(w)
    zero = p.uses_zero()
    if busy is None:
        kind, space = "unknown", LATENCY_SPACE
        tell = "without interconnect metrics latency- and bandwidth-bound cannot be told apart; "
    elif busy >= t["link_busy"]:
        kind, space, tell = "bandwidth", BANDWIDTH_SPACE, "the link is near its limit: move fewer bytes; "
    else:
        kind, space, tell = "latency", LATENCY_SPACE, "the link has headroom: fewer, larger transfers; "
    top = p.top_comm(4)
    per_group = {k: g.comm_s / g.training_s for k, g in p.groups.items() if g.training_s > 0}
    spread = ""
    if len(per_group) > 1:
        lo, hi = min(per_group, key=per_group.get), max(per_group, key=per_group.get)
        spread = f"; by {p.group_label}: {fmt.pct(per_group[lo])} ({lo}) to {fmt.pct(per_group[hi])} ({hi})"
    walls = [w.rank_wall_s(r) for r in w.ranks]
    base = sum(walls) if walls and sum(walls) > 0 else p.training_s
    lost = share * base
    what = "ZeRO-3 communication wait" if zero else "communication wait"
    if zero:
        keys = ", ".join(k.split(".")[-1] for k, v in space["params"].items() if v is not False)
        how = ("`otel-gpu tune --base-config ds.json --space space.json --command '...{config}...'` with the "
               "suggested space (`otel-gpu diagnose --tune-space space.json` writes it)")
        action = (f"{tell}tune ZeRO-3 over {keys}: {how}" if kind != "bandwidth" else
                  f"{tell}tune ZeRO-3 over {keys} (hpZ keeps gathers inside the node, quantized weights halve "
                  f"the bytes): {how}")
    else:
        action = (f"{tell}larger gradient buckets (DDP bucket_cap_mb), overlap communication with compute, "
                  f"fewer synchronisations (gradient accumulation with no_sync)")
    return [Finding(
        rule="comm",
        title=f"{what} {'exceeds' if share > 0.5 else 'takes'} "
              f"{'computation' if share > 0.5 else fmt.pct(share) + ' of training time'}"
              + (f" ({kind}-bound)" if kind != "unknown" else ""),
        severity=severity_for(share, t["wait_share_warning"], t["wait_share_critical"]),
        confidence="high" if busy is not None and p.training_s > 10 else "medium",
        seen=f"{fmt.pct(share)} of training-thread samples in communication functions "
             f"({', '.join(f'{fn} {fmt.pct(s)}' for fn, s in top)}){spread}; {link_text}",
        why=f"ranks wait instead of computing: about {fmt.gpu_time(lost)} of {fmt.gpu_time(base)}",
        action=action, lost_s=lost, lost_share=share,
        basis="communication share of training-thread profile samples x the ranks' wall time",
        where={p.group_label + "s": sorted(per_group)} if per_group else {},
        evidence={"wait_share": round(share, 4), "top_functions": dict((fn, round(s, 4)) for fn, s in top),
                  "link_busy": busy, "bound": kind, "zero": zero, "profile_source": p.source,
                  "per_group_share": {k: round(v, 4) for k, v in per_group.items()},
                  "median_group_share": round(statistics.median(per_group.values()), 4) if per_group else None},
        tune_space=space if zero else None,
    )]
