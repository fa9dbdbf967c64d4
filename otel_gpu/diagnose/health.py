"""Per-rank health series in a diagnosis window: time in Python's garbage collector and PyTorch's CUDA
caching allocator (otel_gpu/training/gc_clock.py, allocator.py). The PromQL parts join `rank_summary`'s
union (one request for all per-rank numbers); `health_inputs` turns their values into RankStats fields.
record/health.py computes the same from a recording."""
from __future__ import annotations

import statistics
from typing import Any

from .. import names as N
from . import fmt
from .model import AllocatorWindow, RankStats

GEN = "otelgpu_gc_generation"
DEVICE = "otelgpu_cuda_device"
RANK_BY = "host_name, otelgpu_rank"
GC_EXCESS_MIN_S = 0.001   # a rank's GC time per step this far above the others' median is named as a cause
# allocator statistic tag -> (AllocatorWindow field, how it is read: "delta" for counters, else over_time fn)
ALLOC = {"aretry": ("retries", N.TRAIN_ALLOC_RETRIES, "delta"), "aoom": ("ooms", N.TRAIN_ALLOC_OOMS, "delta"),
         "aresx": ("reserved_max_b", N.TRAIN_ALLOC_RESERVED, "max"),
         "aresm": ("reserved_mean_b", N.TRAIN_ALLOC_RESERVED, "avg"),
         "aallx": ("allocated_max_b", N.TRAIN_ALLOC_ALLOCATED, "max"),
         "ainam": ("inactive_mean_b", N.TRAIN_ALLOC_INACTIVE_SPLIT, "avg")}


def health_parts(job_sel: str, W: str, selector) -> dict[str, str]:
    """rank_summary parts: GC seconds and collections per generation (last value and value at the window
    start) and, per CUDA device, the allocator's counters (the same pair) and byte gauges (peak or mean)."""
    out = {}
    for tag, spec in (("gc", N.TRAIN_GC_TIME), ("gcn", N.TRAIN_GC_COLLECTIONS)):
        sel = selector(spec.prometheus_name(), job_sel)
        out[f"{tag}:{GEN}"] = f"sum by ({RANK_BY}, {GEN}) (last_over_time({sel}[{W}]))"
        out[f"{tag}0:{GEN}"] = f"sum by ({RANK_BY}, {GEN}) ({sel} offset {W})"
    for tag, (_, spec, how) in ALLOC.items():
        sel = selector(spec.prometheus_name(), job_sel)
        by = f"by ({RANK_BY}, {DEVICE})"
        if how == "delta":
            out[f"{tag}:{DEVICE}"] = f"max {by} (last_over_time({sel}[{W}]))"
            out[f"{tag}0:{DEVICE}"] = f"max {by} ({sel} offset {W})"
        else:
            out[f"{tag}:{DEVICE}"] = f"max {by} ({how}_over_time({sel}[{W}]))"
    return out


def _tagged(v: dict[str, Any], tag: str) -> dict[str, float]:
    prefix = tag + "_"
    return {k[len(prefix):]: x for k, x in v.items() if k.startswith(prefix) and x is not None}


def _increases(v: dict[str, Any], tag: str) -> dict[str, float]:
    """label value -> last value minus the value at the window start (0 when it started inside)."""
    start = _tagged(v, tag + "0")
    return {k: max(0.0, x - start.get(k, 0.0)) for k, x in _tagged(v, tag).items()}


def health_inputs(v: dict[str, Any]) -> dict[str, Any]:
    """A rank's RankStats fields (gc_s, gc_n, alloc) from its rank_summary statistics."""
    alloc: dict[str, AllocatorWindow] = {}
    for tag, (field, _, how) in ALLOC.items():
        values = _increases(v, tag) if how == "delta" else _tagged(v, tag)
        for device, x in values.items():
            setattr(alloc.setdefault(device, AllocatorWindow()), field, x)
    return dict(gc_s=_increases(v, "gc"), gc_n=_increases(v, "gcn"), alloc=alloc)


# ---- GC pauses as a straggler's cause ------------------------------------------------------

def gc_per_step(r: RankStats) -> float | None:
    """Seconds per step this rank spent in Python's garbage collector (all generations); None: not exported."""
    if not r.gc_s or not r.step_count:
        return None
    return sum(r.gc_s.values()) / r.step_count


def gc_excess(w_ranks: list[RankStats], r: RankStats) -> tuple[float, float] | None:
    """(this rank's GC seconds per step, the other ranks' median); None without GC series on both sides."""
    mine = gc_per_step(r)
    others = [x for x in (gc_per_step(o) for o in w_ranks if o is not r) if x is not None]
    if mine is None or not others:
        return None
    return mine, statistics.median(others)


def gc_cause(w_ranks: list[RankStats], r: RankStats) -> str | None:
    """A straggler's candidate cause when its GC time per step exceeds the others' by GC_EXCESS_MIN_S."""
    got = gc_excess(w_ranks, r)
    if got is None or got[0] - got[1] < GC_EXCESS_MIN_S:
        return None
    mine, ref = got
    full = r.gc_s.get("2", 0.0) / r.step_count
    n = r.gc_n.get("2", 0.0) / r.step_count
    return (f"rank {r.rank} spends {fmt.secs(mine)} per step in Python's garbage collector (full gen-2 collections "
            f"{fmt.secs(full)}, {n:.2g} per step) vs {fmt.secs(ref)} on the other ranks")


GC_ACTION = ("its Python garbage collector pauses it: find what creates cyclic garbage every step (objects that "
             "refer to each other: closures, hooks, per-step dicts of tensors), call gc.freeze() after set-up so "
             "full collections skip the long-lived heap, or disable automatic collection (gc.disable()) and call "
             "gc.collect() at the same step on every rank (as torchtitan and Megatron-LM do)")
