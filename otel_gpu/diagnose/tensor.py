"""Tensor pipes idle while the SMs are busy (GPM counters, Hopper and newer).

SM activity says warps were resident; tensor activity says the tensor pipes (the matrix units
that bf16/fp16/TF32/FP8 matmuls run on) were issuing. A training job whose SMs are busy most of
the time but whose tensor pipes are not spends its GPU time elsewhere: matmuls in plain fp32
(no TF32, no autocast) run on the CUDA cores, or the time goes to elementwise, normalization,
attention-softmax and other memory-bound kernels. The rule reports what it saw and what to check;
it cannot tell which it is from counters alone, so it never estimates time lost.
"""
from __future__ import annotations

import statistics

from ..words import all_of
from . import fmt
from .findings import Finding
from .model import GpuStats, Window
from .thresholds import Thresholds

RULE = "tensor"


def _where(gpus: list[GpuStats]) -> dict[str, list[str]]:
    out = {"nodes": sorted({g.host for g in gpus}), "gpus": [g.name for g in gpus]}
    ranks = sorted({r for g in gpus for r in g.ranks}, key=lambda r: (len(r), r))
    if ranks:
        out["ranks"] = ranks
    return out


def tensor_idle(w: Window, th: Thresholds) -> list[Finding]:
    """GPUs whose mean SM activity is at least `sm_min` with mean tensor activity below `info_max`
    (warning below `warning_max`); quiet without GPUs (the GPU rules say so) and on idle GPUs."""
    t = th["tensor"]
    if not w.gpus:
        return []
    measured = [g for g in w.gpus if g.tensor is not None and g.sm is not None]
    if not measured:   # no GPM (before Hopper): sm_idle's card already says so, and nothing here can be acted on
        return []
    busy = [g for g in measured if g.sm >= t["sm_min"]]
    idle = [g for g in busy if g.tensor < t["info_max"]]
    if not idle:
        return []
    tensor = statistics.fmean(g.tensor for g in idle)
    sm = statistics.fmean(g.sm for g in idle)
    util = [g.util for g in idle if g.util is not None]
    dram = [g.dram for g in idle if g.dram is not None]
    occ = [g.occupancy for g in idle if g.occupancy is not None]
    dram_mean = statistics.fmean(dram) if dram else None
    low = min(idle, key=lambda g: g.tensor)
    counters = [f"SM activity {fmt.pct(sm)}", f"tensor activity {fmt.pct(tensor)}"]
    if util:
        counters.insert(0, f"utilization {fmt.pct(statistics.fmean(util))}")
    if dram_mean is not None:
        counters.append(f"DRAM bandwidth {fmt.pct(dram_mean)} of peak")
    if occ:
        counters.append(f"SM occupancy {fmt.pct(statistics.fmean(occ))}")
    memory_bound = dram_mean is not None and dram_mean >= t["dram_busy"]
    meaning = ["matmuls not on the tensor cores: fp32 weights and activations without TF32 or autocast run on "
               "the CUDA cores (tensor activity near 0 says this)",
               "GPU time in elementwise, normalization, softmax/attention or optimizer kernels rather than matmuls"
               + (" (DRAM bandwidth is high: memory-bound kernels)" if memory_bound else ""),
               "matmuls too small or badly shaped to keep the tensor pipes fed (dimensions not multiples of 8/16)"]
    on = f"on {all_of(len(w.gpus), 'GPU')}" if len(idle) == len(w.gpus) else f"on {len(idle)} of {len(w.gpus)} GPUs"
    return [Finding(
        rule=RULE,
        title=f"tensor pipes active {fmt.pct(tensor)} of the time while SMs are {fmt.pct(sm)} active",
        severity="warning" if tensor < t["warning_max"] else "info",
        confidence="medium",
        seen=f"training-time means {on}: {', '.join(counters)} (lowest tensor activity {fmt.pct(low.tensor)} "
             f"on {low.name})",
        why="the SMs are busy but the matrix units that do most of a model's arithmetic mostly are not. It can "
            "mean: " + "; ".join(meaning),
        action="check the dtypes the model computes in (torch.autocast(dtype=torch.bfloat16), or "
               "torch.set_float32_matmul_precision('high') for TF32 in fp32 code); take a profiler trace of a few "
               "steps (`otel-gpu trace analyze`) and compare the time in GEMM kernels with elementwise and attention "
               "kernels; fuse those (torch.compile, scaled_dot_product_attention / FlashAttention, fused optimizers)",
        basis="GPM tensor and SM activity means over training time; no time estimate (counters do not say how "
              "much faster the job could run)",
        where=_where(idle),
        evidence={"tensor_activity": round(tensor, 4), "sm_activity": round(sm, 4),
                  "dram_activity": None if dram_mean is None else round(dram_mean, 4),
                  "sm_occupancy": round(statistics.fmean(occ), 4) if occ else None,
                  "per_gpu": {g.name: {"tensor": g.tensor, "sm": g.sm, "dram": g.dram, "occupancy": g.occupancy}
                              for g in idle},
                  "gpus_with_gpm": len(measured)},
    )]
