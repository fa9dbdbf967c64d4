"""A trial's work and energy over its steady window: tokens/s, TFLOP/s per GPU, J/step and J/token.

Tokens and model FLOPs: the ranks' counters' increase over the window (each rank's value at the end
less its value at or before the start; PromQL `x - x offset <window>`, or all of it for a series born
inside), over the window's seconds; TFLOP/s per GPU divides by the GPUs the trial's ranks use (the
GPUs listing their processes, else every GPU the node agent read). Energy: energy.py over the same
window, from the same raw points both ways (energy_read.py). Every key without a number has its reason.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from .. import names as N
from ..energy_read import from_prometheus as energy_prom, from_recording as energy_rec
from .evidence import increase

KEYS = ("tokens_per_s", "tflops_per_gpu", "joules_per_step", "joules_per_token")
NO_TOKENS = ("not checked: no tokens counted in the steady window (a plain loop passes step(tokens=...); "
             "batches with input_ids are counted)")
NO_FLOPS = "not checked: no model FLOPs counted in the steady window (otelgpu.train.flops: the model's shape not known)"
NO_GPUS = "not checked: no GPU readings in the steady window (no node agent, or no NVIDIA GPU)"


def combine(tokens: float | None, flops: float | None, gpus: int, energy, seconds: float) -> dict[str, Any]:
    """The four numbers and their reasons (pure); `energy` is energy.py's job row."""
    out: dict[str, Any] = {k: None for k in KEYS}
    why: dict[str, str] = {}
    if tokens and seconds > 0:
        out["tokens_per_s"] = tokens / seconds
    else:
        why["tokens_per_s"] = NO_TOKENS
    if not flops or seconds <= 0:
        why["tflops_per_gpu"] = NO_FLOPS
    elif gpus <= 0:
        why["tflops_per_gpu"] = NO_GPUS
    else:
        out["tflops_per_gpu"] = flops / seconds / gpus / 1e12
    out["joules_per_step"], out["joules_per_token"] = energy.j_per_step, energy.j_per_token
    if energy.j_per_step is None:
        why["joules_per_step"] = energy.why_step
    if energy.j_per_token is None:
        why["joules_per_token"] = energy.why_token
    out["not_checked"] = why
    return out


def from_recording(rec, t0: float, t1: float) -> dict[str, Any]:
    def total(spec) -> float | None:
        grown = [increase(s.points, t0, t1) for s in rec.series(spec.name, None, t1)]
        grown = [g for g in grown if g is not None]
        return sum(grown) if grown else None
    gpus = {(s.get(N.HOST), s.get(N.HW_ID)) for s in rec.series(N.GPU_MEMORY_USAGE.name, t0, t1)}
    used = {(s.get(N.HOST), s.get(N.HW_ID)) for s in rec.series(N.GPU_PROCESS_MEMORY.name, t0, t1) if s.get(N.RANK)}
    _, job = energy_rec(rec, t0, t1)
    return combine(total(N.TRAIN_TOKENS), total(N.TRAIN_FLOPS), len(used or gpus), job, t1 - t0)


def from_prometheus(query: Callable[[str, float], list], node_sel: str, trial_sel: str, t0: float, t1: float,
                    window: str) -> dict[str, Any]:
    """`window`: the PromQL range of [t0, t1] (evidence.window_ms); selectors without braces."""
    def brace(*parts: str) -> str:
        parts = tuple(p for p in parts if p)
        return "{" + ",".join(parts) + "}" if parts else ""

    def scalar(q: str) -> float | None:
        result = query(q, t1)
        value = result[0].value if result else None
        return value if isinstance(value, (int, float)) and math.isfinite(value) else None

    def total(spec) -> float | None:
        x = spec.prometheus_name() + brace(trial_sel)
        return scalar(f"sum(({x} - {x} offset {window}) or {x})")
    rank = f'{N.RANK.replace(".", "_")}!=""'
    by = "host_name, hw_id"
    used = scalar(f"count(count by ({by}) (max_over_time({N.GPU_PROCESS_MEMORY.prometheus_name()}"
                  f"{brace(node_sel, rank)}[{window}])))")
    seen = scalar(f"count(count by ({by}) (max_over_time({N.GPU_MEMORY_USAGE.prometheus_name()}{brace(node_sel)}[{window}])))")
    _, job = energy_prom(query, node_sel, trial_sel, t0, t1)
    return combine(total(N.TRAIN_TOKENS), total(N.TRAIN_FLOPS), int(used or seen or 0), job, t1 - t0)
