"""Achieved model FLOP/s and MFU per rank and per job, over a diagnosis window (pure).

MFU = the model FLOPs a rank trained on per second of its wall time in the window, over the dense peak
of its GPU for the dtype it computes in (otelgpu.gpu.peak.flops, otel_gpu/peaks.py). A rank's GPU is the
one NVML lists its process on (the agent's per-process attribution, `GpuStats.ranks`). The job's MFU is
its ranks' FLOPs over the sum of their peak x wall time (ranks that cannot be judged left out, and said).
Every number that cannot be judged says "not checked: why" instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..peaks import FP8_NOT_CHECKED, peak_of
from . import fmt
from .model import GpuStats, RankStats, Window

TERA = 1e12
NO_GPU = "not checked: no GPU"


@dataclass
class RankWork:
    """One rank: rates over its wall time in the window (FLOP/s, tokens/s), its GPU's peak, its MFU."""
    rank: str
    host: str
    wall_s: float
    flops_per_s: float | None = None
    tokens_per_s: float | None = None
    dtype: str = ""
    gpu: str = ""                  # host/gpuN of its GPU ("" none)
    model: str = ""                # that GPU's product name
    peak: float | None = None      # dense FLOP/s of that GPU in `dtype`
    mfu: float | None = None
    why_not: str = ""              # why `mfu` is None


@dataclass
class JobWork:
    ranks: list[RankWork] = field(default_factory=list)
    flops_per_s: float | None = None          # all ranks together
    flops_per_s_per_gpu: float | None = None  # over the ranks that have a GPU (else per rank)
    tokens_per_s: float | None = None         # all ranks together
    mfu: float | None = None
    mfu_ranks: int = 0                        # ranks the MFU is over
    why_not: str = ""
    tensor: float | None = None               # mean GPM tensor-pipe activity of the judged ranks' GPUs
    basis: str = ""

    def beside_tensor(self) -> str:
        """MFU set beside the tensor pipes' activity: tensor work that is not the model's, or a figure not read."""
        if self.mfu is None or self.tensor is None:
            return ""
        gap = self.tensor - self.mfu
        text = f"tensor activity {fmt.pct(self.tensor)}, MFU {mfu_pct(self.mfu)}"
        if gap > 0.1 and self.tensor > 1.5 * self.mfu:
            return (text + ": the tensor pipes are busy with work that is not the model's FLOPs (recomputation, "
                    "padding, optimizer or framework kernels, lower-precision pipes at a lower rate)")
        return text


def _gpu_of(r: RankStats, gpus: list[GpuStats]) -> tuple[GpuStats | None, str]:
    """The GPU rank `r`'s process is on; a rank listed on several prefers the one it has alone."""
    mine = [g for g in gpus if g.host == r.host and r.rank in g.ranks]
    if len(mine) > 1:
        alone = [g for g in mine if g.ranks == [r.rank]]
        mine = alone if len(alone) == 1 else mine
    if len(mine) == 1:
        return mine[0], ""
    if not mine:
        return None, f"not checked: rank {r.rank} was not seen on a GPU (NVML listed no process of it)"
    return None, f"not checked: rank {r.rank} is on {len(mine)} GPUs ({', '.join(g.name for g in mine)})"


def _peak(g: GpuStats, dtype: str) -> tuple[float | None, str]:
    if not g.peaks:
        if g.model:
            return None, peak_of(g.model).why_not or f"not checked: no peak exported for {g.name} ({g.model})"
        return None, f"not checked: no peak exported for {g.name} (an agent before the peak table, or not in it)"
    if dtype == "fp8":
        return None, FP8_NOT_CHECKED
    value = g.peaks.get(dtype)
    if value is None:
        return None, f"not checked: {g.model or g.name} has no {dtype} peak (no {dtype} tensor cores)"
    return value, ""


def rank_work(w: Window, r: RankStats) -> RankWork:
    wall = w.rank_wall_s(r)
    out = RankWork(r.rank, r.host, wall, dtype=r.compute_dtype)
    if wall > 0:
        out.flops_per_s = r.flops / wall if r.flops is not None else None
        out.tokens_per_s = r.tokens / wall if r.tokens is not None else None
    if not w.gpus:
        out.why_not = NO_GPU
        return out
    g, why = _gpu_of(r, w.gpus)
    if g is not None:
        out.gpu, out.model = g.name, g.model
    if r.flops is None:
        out.why_not = "not checked: no model FLOPs exported (otelgpu.train.flops: a model without a transformer shape)"
    elif wall <= 0:
        out.why_not = "not checked: no wall time of the rank in the window"
    elif g is None:
        out.why_not = why
    elif not r.compute_dtype:
        out.why_not = "not checked: the compute dtype was not seen (otelgpu.train.compute.dtype: no training forward hooked)"
    else:
        out.peak, out.why_not = _peak(g, r.compute_dtype)
        if out.peak:
            out.mfu = out.flops_per_s / out.peak
    return out


def job_work(w: Window) -> JobWork:
    """Every rank's work and the job's: FLOP/s, FLOP/s per GPU, tokens/s, MFU beside tensor activity."""
    ranks = [rank_work(w, r) for r in w.ranks]
    job = JobWork(ranks=ranks)
    rates = [x.flops_per_s for x in ranks if x.flops_per_s is not None]
    if rates:
        job.flops_per_s = sum(rates)
        on_gpu = [x.flops_per_s for x in ranks if x.flops_per_s is not None and x.gpu]
        job.flops_per_s_per_gpu = sum(on_gpu) / len(on_gpu) if on_gpu else sum(rates) / len(rates)
    toks = [x.tokens_per_s for x in ranks if x.tokens_per_s is not None]
    job.tokens_per_s = sum(toks) if toks else None
    judged = [x for x in ranks if x.mfu is not None]
    if judged:
        job.mfu = sum(x.flops_per_s * x.wall_s for x in judged) / sum(x.peak * x.wall_s for x in judged)
        job.mfu_ranks = len(judged)
        names = {x.gpu for x in judged}
        tensor = [g.tensor for g in w.gpus if g.name in names and g.tensor is not None]
        job.tensor = sum(tensor) / len(tensor) if tensor else None
        dtypes = sorted({x.dtype for x in judged})
        models = sorted({x.model for x in judged if x.model})
        job.basis = (f"model FLOPs ({', '.join(sorted({r.flops_basis for r in w.ranks if r.flops_basis}))}) per "
                     f"second of each rank's wall time over the dense {'/'.join(dtypes)} peak of its GPU "
                     f"({', '.join(models) or 'from the agent'}; otel_gpu/peaks.py)"
                     + (f"; {len(ranks) - len(judged)} of {len(ranks)} ranks not judged" if len(judged) < len(ranks) else ""))
    else:
        reasons = sorted({x.why_not for x in ranks if x.why_not})
        job.why_not = reasons[0] if len(reasons) == 1 else "; ".join(reasons) or "not checked: no ranks"
    return job


def mfu_pct(x: float | None) -> str:
    """An MFU as a percentage: one decimal, two significant digits below 0.1% (a CPU job on a fake GPU)."""
    if x is None:
        return "-"
    if 0 < x < 0.001:
        digits = 1 - math.floor(math.log10(x * 100))   # two significant digits
        return f"{x * 100:.{digits}f}%"
    return fmt.pct(x)


def tflops(x: float | None) -> str:
    """FLOP/s as TFLOP/s text ('-' when unknown)."""
    return "-" if x is None else f"{x / TERA:.3g} TFLOP/s"
