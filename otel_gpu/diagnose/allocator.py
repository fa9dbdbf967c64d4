"""The CUDA caching allocator per rank: allocation retries and fragmentation, with their evidence.

A retry is a cudaMalloc that failed: PyTorch frees every cached block it can (synchronising the device)
and tries again, a silent slowdown (a step with retries can take seconds longer). Fragmentation is memory
reserved from CUDA but held in the free pieces of split blocks (inactive split), unusable for a larger
tensor: the next allocation reserves more or retries. `expandable_segments` maps more memory into one
segment instead of reserving new blocks, which removes most of both.
"""
from __future__ import annotations

from ..words import count
from . import fmt
from .findings import Finding, missing_input
from .model import AllocatorWindow, RankStats, Window
from .thresholds import Thresholds

FIX = ("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch 2.1 or newer) in every rank's environment; "
       "if retries remain, make the communication buckets smaller (DDP bucket_cap_mb, DeepSpeed reduce_bucket_size, "
       "allgather_bucket_size and stage3_prefetch_bucket_size) or the micro-batch, and remove "
       "torch.cuda.empty_cache() calls from the loop")
NOT_EXPORTED = ("no rank exported CUDA allocator series (otelgpu.train.allocator.*): the ranks did not run under "
                "otel-gpu's training hooks, or never initialised CUDA")


def _devices(w: Window) -> list[tuple[RankStats, str, AllocatorWindow]]:
    return [(r, d, a) for r in w.ranks for d, a in sorted(r.alloc.items())]


def _steps(r: RankStats) -> float:
    return r.step_count or r.steps or 0.0


def _where(rows) -> dict[str, list[str]]:
    return {"ranks": sorted({r.rank for r, _, _ in rows}, key=lambda x: (len(x), x)),
            "nodes": sorted({r.host for r, _, _ in rows})}


def _evidence(rows) -> dict[str, dict]:
    out = {}
    for r, d, a in rows:
        steps = _steps(r)
        out[f"rank {r.rank} cuda:{d}"] = {
            "retries": a.retries, "retries_per_step": round(a.retries / steps, 6) if a.retries is not None and steps else None,
            "ooms": a.ooms, "fragmentation": round(a.fragmentation, 4) if a.fragmentation is not None else None,
            "reserved_peak_bytes": a.reserved_max_b, "allocated_peak_bytes": a.allocated_max_b,
            "inactive_split_mean_bytes": a.inactive_mean_b, "steps": steps}
    return out


def retrying(w: Window, th: Thresholds) -> list:
    """(rank, device, allocator) rows with a retry or an OOM in the window."""
    return [(r, d, a) for r, d, a in _devices(w) if (a.retries or 0) > 0 or (a.ooms or 0) > 0]


def fragmented(w: Window, th: Thresholds) -> list:
    t = th["allocator"]
    return [(r, d, a) for r, d, a in _devices(w) if a.fragmentation is not None
            and (a.reserved_mean_b or 0) >= t["reserved_min_bytes"] and a.fragmentation >= t["fragmentation_warning"]]


def allocator(w: Window, th: Thresholds) -> list[Finding]:
    """Allocation retries (or OOMs) and fragmentation on any rank's device, with the fix."""
    t = th["allocator"]
    rows = _devices(w)
    if not rows:
        # said for a GPU job's ranks; a CPU job, or GPUs without training ranks (--gpu-only), have nothing to check
        return [missing_input("allocator", "CUDA allocator health", NOT_EXPORTED, ["allocator metrics"])] if w.gpus and w.ranks else []
    out = []
    hit = retrying(w, th)
    if hit:
        worst = max(hit, key=lambda x: ((x[2].retries or 0) / (_steps(x[0]) or 1), x[2].ooms or 0))
        r, d, a = worst
        per_step = (a.retries or 0) / (_steps(r) or 1)
        retries = sum(x[2].retries or 0 for x in hit)
        ooms = sum(x[2].ooms or 0 for x in hit)
        what = " and ".join(p for p in (count(int(retries), "allocation retry", "allocation retries") if retries else "",
                                         count(int(ooms), "out-of-memory error") if ooms else "") if p)
        out.append(Finding(
            rule="allocator",
            title=f"CUDA allocator: {what} on {count(len({x[0].rank for x in hit}), 'rank')}"
                  + (f" ({per_step:.2g} retries per step on rank {r.rank})" if a.retries else ""),
            severity="critical" if per_step >= t["retries_per_step_critical"] else "warning",
            confidence="high",
            seen=f"rank {r.rank} cuda:{d}: {a.retries or 0:.0f} retries over {_steps(r):.0f} steps ({per_step:.3g} per step), "
                 f"{a.ooms or 0:.0f} OOMs; reserved peak {fmt.size(a.reserved_max_b)}, allocated peak "
                 f"{fmt.size(a.allocated_max_b)}"
                 + (f", fragmentation {fmt.pct(a.fragmentation)}" if a.fragmentation is not None else ""),
            why="each retry frees the allocator's whole cache and synchronises the device before cudaMalloc is tried "
                "again: the step stalls for it, silently (no error, only slower steps)",
            action=FIX, basis="counter increases in the window (torch.cuda.memory_stats num_alloc_retries, num_ooms); "
                              "the time a retry costs is not measured",
            where=_where(hit), evidence={"per_device": _evidence(hit), "retries_per_step": round(per_step, 6)}))
    frag = [x for x in fragmented(w, th) if x not in hit]
    if frag:
        r, d, a = max(frag, key=lambda x: x[2].fragmentation)
        out.append(Finding(
            rule="allocator",
            title=f"CUDA allocator fragmentation {fmt.pct(a.fragmentation)} on rank {r.rank} (cuda:{d})",
            severity="warning", confidence="medium",
            seen=f"mean inactive split {fmt.size(a.inactive_mean_b)} of mean reserved {fmt.size(a.reserved_mean_b)} "
                 f"on rank {r.rank} cuda:{d} (peak reserved {fmt.size(a.reserved_max_b)}); no retries yet",
            why="reserved memory held in the free pieces of split blocks cannot take a larger tensor: the allocator "
                "reserves more, and near the GPU's limit it starts flushing its cache and retrying",
            action=FIX, basis="inactive_split_bytes.all.current / reserved_bytes.all.current, means over the window",
            where=_where(frag), evidence={"per_device": _evidence(frag)}))
    return out


def memory_advice(w: Window, th: Thresholds) -> tuple[str, dict]:
    """What the memory rule advises for a GPU near full, by the allocator's evidence: expandable segments only
    where retries or fragmentation were seen; (action, evidence)."""
    base = ("lower the micro-batch or sequence length, enable activation checkpointing, or use ZeRO-3 / offload to "
            "shard more state")
    rows = _devices(w)
    if not rows:
        return base + f"; allocator not checked: {NOT_EXPORTED}", {"allocator": "not checked"}
    hit, frag = retrying(w, th), fragmented(w, th)
    if hit or frag:
        return ("the allocator is retrying or fragmented (see the allocator finding): " + FIX + "; else " + base,
                {"allocator": {"retries": sum(a.retries or 0 for _, _, a in hit),
                               "fragmented_devices": len(frag)}})
    worst = max((a.fragmentation or 0.0 for _, _, a in rows), default=0.0)
    return (base + f"; the allocator shows no retries and at most {fmt.pct(worst)} fragmentation on "
            f"{count(len(rows), 'device')}: expandable segments would not help",
            {"allocator": {"retries": 0, "fragmentation_max": round(worst, 4)}})
