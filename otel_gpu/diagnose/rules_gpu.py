"""GPU rules: SMs idle behind a busy "utilization", power/thermal throttling, memory pressure."""
from __future__ import annotations

import statistics

from ..words import all_of, count
from . import fmt
from .allocator import memory_advice
from .findings import Finding, missing_input, severity_for
from .thresholds import Thresholds
from .model import GpuStats, Window

NO_AGENT = "run the otel-gpu agent on the job's nodes (with the same OTELGPU_JOB)"


def agent_advice(w: Window) -> str:
    """What to do about missing agent series, never what already ran: the agent ran (its series or its
    log are there) but saw no GPU, a recording made without it, or (Prometheus) run it."""
    if w.agent:
        where = "agent.log in the run directory" if w.source == "recording" else "the agent's log"
        return ("the node agent ran and reported no GPU: a CPU-only run has nothing to check here; on a GPU node, "
                f"NVML could not be read (see {where})")
    if w.source == "recording":
        return "the recording has no node agent series: record without `--no-agent` (`otel-gpu run` starts the agent)"
    return NO_AGENT


def no_gpus(w: Window, rule: str, what: str) -> list[Finding]:
    """The not-checked note of a GPU rule over a window without GPUs: said once (by `sm_idle`) when the
    agent ran and saw no GPU (a CPU-only run), by every GPU rule when the agent's series are missing."""
    if w.agent and rule != "sm_idle":
        return []
    return [missing_input(rule, what, agent_advice(w), ["GPU metrics"])]
POWER = ("sw_power_cap", "hw_power_brake")
THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")
HW = ("hw_slowdown",)


def _where(gpus: list[GpuStats]) -> dict[str, list[str]]:
    ranks = sorted({r for g in gpus for r in g.ranks}, key=lambda r: (len(r), r))
    out = {"nodes": sorted({g.host for g in gpus}), "gpus": [g.name for g in gpus]}
    if ranks:
        out["ranks"] = ranks
    return out


def sm_idle(w: Window, th: Thresholds) -> list[Finding]:
    """NVML utilization high (a kernel was running) while GPM SM activity is low (few SMs busy)."""
    t = th["sm_idle"]
    if not w.gpus:
        return no_gpus(w, "sm_idle", "GPU counters")
    with_sm = [g for g in w.gpus if g.sm is not None and g.util is not None]
    if not with_sm:
        return [missing_input(
            "sm_idle", "SMs idle behind busy utilization",
            "needs GPM SM activity (NVIDIA Hopper or newer); NVML utilization alone cannot tell one tiny "
            "kernel from a full GPU", ["otelgpu_gpu_sm_activity"])]
    busy = [g for g in with_sm if g.util >= t["util_min"]]
    flagged = [g for g in busy if g.sm < t["ratio_max"] * g.util]
    if not flagged:
        return []
    lost = sum(w.active_s(g.first_t, g.last_t) * max(0.0, g.util - g.sm) for g in flagged)
    total = w.gpu_time_s() or 1.0
    share = lost / total
    util = statistics.fmean(g.util for g in flagged)
    sm = statistics.fmean(g.sm for g in flagged)
    occ = f" on {len(flagged)} of {len(w.gpus)} GPUs" if len(flagged) < len(w.gpus) else f" on {all_of(len(w.gpus), 'GPU')}"
    sev = th["severity"]
    return [Finding(
        rule="sm_idle",
        title=f"GPU utilization {fmt.pct(util)} but SM activity {fmt.pct(sm)}: SMs mostly idle",
        severity=severity_for(share, sev["warning_share"], sev["critical_share"]),
        confidence="high" if len(flagged) >= max(1, len(with_sm) // 2) else "medium",
        seen=f"mean NVML utilization {fmt.pct(util)} vs mean GPM SM activity {fmt.pct(sm)}{occ} "
             f"(lowest SM activity {fmt.pct(min(g.sm for g in flagged))} on {min(flagged, key=lambda g: g.sm).name})",
        why=f"'utilization' only says some kernel was running; SMs were idle for about {fmt.gpu_time(lost)} "
            f"({fmt.pct(share)} of GPU time) that the GPUs reported as busy",
        action="find what the GPU waits on: check the communication and input findings, profile one step "
               "(`otel-gpu trace analyze` on a PyTorch profiler trace) for small or serialized kernels; larger "
               "micro-batches, fused kernels or CUDA graphs raise SM activity",
        lost_s=lost, lost_share=share,
        basis="sum over GPUs of (utilization - SM activity) x active time: the busy-but-idle upper bound",
        where=_where(flagged),
        evidence={"utilization": round(util, 4), "sm_activity": round(sm, 4), "gpus_flagged": len(flagged),
                  "gpus_with_gpm": len(with_sm)},
    )]


def _clock_ref(w: Window, share_min: float) -> float | None:
    """Reference SM clock: the median mean clock of GPUs with no slowdown reason active (same work,
    same idle periods), else the job's peak clock."""
    calm = [g.clock_hz for g in w.gpus if g.clock_hz and max(g.throttle.values(), default=0.0) < share_min]
    if calm:
        return statistics.median(calm)
    peaks = [g.clock_max_hz for g in w.gpus if g.clock_max_hz]
    return max(peaks) if peaks else None


def throttling(w: Window, th: Thresholds) -> list[Finding]:
    """Power, thermal or hardware slowdown reasons active for a share of the window."""
    t, sev = th["throttle"], th["severity"]
    if not w.gpus:
        return no_gpus(w, "throttle", "Power/thermal throttling")
    if not any(g.throttle for g in w.gpus):
        return [missing_input("throttle", "Power/thermal throttling",
                              "needs NVML clock-event reasons (not readable on MIG devices or this driver)",
                              ["otelgpu_gpu_clock_event_active"])]
    ref = _clock_ref(w, t["share_min"])
    temps = [g.temp_c for g in w.gpus if g.temp_c is not None]
    med_temp = statistics.median(temps) if temps else None
    out = []
    for kind, reasons, label in (("power", POWER, "power capping"), ("thermal", THERMAL, "thermal slowdown"),
                                 ("hw", HW, "hardware slowdown")):
        hit: list[tuple[GpuStats, float, float, str]] = []
        for g in w.gpus:
            active = max((g.throttle.get(r, 0.0) for r in reasons), default=0.0)
            if active < t["share_min"]:
                continue
            active_s = w.active_s(g.first_t, g.last_t) or w.duration_s
            if g.clock_hz and ref:
                factor = max(0.0, 1.0 - g.clock_hz / ref)
                basis = "mean SM clock vs unthrottled GPUs" if factor > 0 else "clocks not lower than unthrottled GPUs"
            elif kind == "power":
                factor, basis = 0.0, "no clock data"
            else:
                factor, basis = t["hw_slowdown_factor"] * active, "assumed clock factor while active"
            hit.append((g, active, active_s * factor, basis))
        if not hit:
            continue
        gpus = [h[0] for h in hit]
        lost = sum(h[2] for h in hit)
        share = lost / (w.gpu_time_s() or 1.0)
        worst = max(hit, key=lambda h: h[1])
        g = worst[0]
        clock = f", SM clock {g.clock_hz / 1e6:.0f} MHz (reference {ref / 1e6:.0f} MHz)" if g.clock_hz and ref else ""
        temp = f", {g.temp_c:.0f} C (max {g.temp_max_c:.0f} C, job median {med_temp:.0f} C)" if g.temp_c is not None and g.temp_max_c is not None and med_temp is not None else ""
        power = f", {g.power_w:.0f} of {g.power_limit_w:.0f} W" if g.power_w and g.power_limit_w else ""
        severity = severity_for(share, sev["warning_share"], sev["critical_share"])
        if kind != "power" and severity == "info":
            severity = "warning"   # a thermal or hardware slowdown is worth a look even when short
        action = {
            "power": "power capping at full load is by design; if clocks drop far below peak, check the power "
                     "limit (`nvidia-smi -q -d POWER`), the node's power budget and cooling",
            "thermal": "check the node's cooling (fans, airflow, inlet temperature) and the GPU's position in "
                       "the chassis; compare with the other nodes' temperatures",
            "hw": "HW slowdown halves clocks or worse: check power supply and temperature sensors on the node, "
                  "and `nvidia-smi -q -d PERFORMANCE`; drain the node if it persists",
        }[kind]
        out.append(Finding(
            rule="throttle",
            title=f"{label} on {len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({fmt.compact([x.host for x in gpus], 3)})",
            severity=severity, confidence="high" if worst[3].startswith("mean SM clock") else "medium",
            seen=f"{'/'.join(r for r in reasons if g.throttle.get(r, 0.0) >= t['share_min'])} active {fmt.pct(worst[1])} of the {'training time' if w.train_start is not None else 'window'} on {g.name}{clock}{temp}{power}",
            why=f"lower clocks stretch every kernel: about {fmt.gpu_time(lost)} ({fmt.pct(share)} of GPU time) at stake",
            action=action, lost_s=lost, lost_share=share,
            basis=f"active time x (1 - mean SM clock / reference clock); {worst[3]}",
            where=_where(gpus),
            evidence={"reasons": list(reasons), "active_share_max": round(worst[1], 4),
                      "per_gpu": {x.name: round(a, 4) for x, a, _, _ in hit}},
        ))
    hot = [g for g in w.gpus if g.temp_max_c is not None and g.temp_max_c >= t["temperature_c"]]
    if hot and not any(f.evidence.get("reasons") == list(THERMAL) for f in out):
        out.append(Finding(
            rule="throttle", title=f"GPUs running hot ({max(g.temp_max_c for g in hot):.0f} C)",
            severity="warning", confidence="medium",
            seen=f"peak temperature at or above {t['temperature_c']:.0f} C on {fmt.compact([g.name for g in hot], 4)}",
            why="no slowdown reported yet, but GPUs this hot are close to thermal capping",
            action="check the cooling of those nodes before it costs clock speed",
            where=_where(hot), evidence={g.name: g.temp_max_c for g in hot}))
    return out


def memory_pressure(w: Window, th: Thresholds) -> list[Finding]:
    """GPU memory near its size (OOM / allocator retries), host swapping."""
    t = th["memory"]
    out = []
    if not w.gpus and not w.nodes:
        return [missing_input("memory", "Memory pressure", agent_advice(w), ["GPU and host metrics"])]
    full = [g for g in w.gpus if g.mem_used_b and g.mem_limit_b and g.mem_used_b / g.mem_limit_b >= t["gpu_used_max"]]
    if full:
        top = max(full, key=lambda g: g.mem_used_b / g.mem_limit_b)
        advice, alloc = memory_advice(w, th)   # expandable segments only on the allocator's evidence
        out.append(Finding(
            rule="memory", title=f"GPU memory near full ({fmt.pct(top.mem_used_b / top.mem_limit_b)} peak)",
            severity="warning", confidence="high",
            seen=f"peak {fmt.size(top.mem_used_b)} of {fmt.size(top.mem_limit_b)} on {top.name}; "
                 f"{fmt.count(len(full), 'GPU')} at or above {fmt.pct(t['gpu_used_max'], 0)}",
            why="near the limit the caching allocator frees and retries (slow steps) and the next larger batch "
                "or sequence runs out of memory",
            action=advice, basis="risk: time lost is not measurable from the metrics", where=_where(full),
            evidence={**{g.name: round(g.mem_used_b / g.mem_limit_b, 4) for g in full}, **alloc}))
    swapping = [n for n in w.nodes if (n.swap_used_b or 0) >= t["swap_used_bytes"]
                or (n.swap_pages_per_s or 0) >= t["swap_pages_per_s"]]
    if swapping:
        n = max(swapping, key=lambda n: (n.swap_pages_per_s or 0, n.swap_used_b or 0))
        out.append(Finding(
            rule="memory", title=f"host swapping on {count(len(swapping), 'node')}",
            severity="warning", confidence="high",
            seen=f"{n.host}: peak swap in use {fmt.size(n.swap_used_b)}, {n.swap_pages_per_s or 0:.0f} pages/s "
                 f"swapped, peak memory use {fmt.pct(n.mem_used)}",
            why="a rank whose pages are swapped out stalls (data loader workers, pinned buffers, CPU offload), "
                "and every other rank waits for it",
            action="fewer DataLoader workers or smaller prefetch, less CPU offload per node, or more host memory",
            basis="risk: time lost is not measurable from the metrics",
            where={"nodes": [x.host for x in swapping]},
            evidence={x.host: {"swap_used_bytes": x.swap_used_b, "pages_per_s": x.swap_pages_per_s} for x in swapping}))
    return out
