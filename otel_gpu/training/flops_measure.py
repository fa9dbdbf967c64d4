"""Model FLOPs measured once with `torch.utils.flop_counter.FlopCounterMode` (`OTELGPU_FLOPS=measure`).

Opt-in, for models the formula of flops.py does not fit (convolutions) or where a person asks for
the measured figure instead. One training batch is measured on the training thread: from the fetch
of the third training batch (the first pays lazy initialisation, the second is the baseline for
the cost) to the first of the optimizer step's end, the next fetch or the loader's end: forward, backward (autograd's threads inherit the
mode) and optimizer. Its FLOPs per sample (leading dimension of the batch) times the samples of
every training batch trained on is the counter's value, basis "measured" (flops.BASIS_TEXT).

What it cost is said once in a log line: that batch's wall time under the mode (every operator goes
through Python) less the batch before it, in seconds (a loop of fewer than three training batches
is not measured). FlopCounterMode has no formula for
PyTorch's CPU flash-attention kernel; it is added here with PyTorch's own SDPA formulas, so a
CPU run counts its attention as a GPU run does. Nothing here synchronises with a device.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any, Callable

from .flops import BASIS_MEASURED, BASIS_TEXT

SETTING = "OTELGPU_FLOPS"
FORMULA, MEASURE = "formula", "measure"
CHOICES = (FORMULA, MEASURE)
MEASURED_BATCH = 3   # the first pays lazy initialisation, the second is the baseline for the cost

log = logging.getLogger("otel_gpu.training")


def requested(env: Mapping[str, str] = os.environ) -> bool:
    """True when `OTELGPU_FLOPS=measure` (checked by settings_check before a run starts)."""
    return env.get(SETTING, "").strip() == MEASURE


def batch_samples(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor (a mapping's first value, a
    tuple's first item); 0 when none is found."""
    for _ in range(4):   # nesting bound: a tuple of a dict of tensors at most, in practice
        if isinstance(batch, Mapping):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (tuple, list)):
            batch = batch[0] if batch else None
        else:
            break
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else 0


def _cpu_attention_formulas() -> dict:
    """FlopCounterMode formulas for the CPU flash-attention kernel, from PyTorch's SDPA formulas."""
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    out = {}
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None:
        out[fwd] = lambda q, k, v, *args, out_shape=None, **kw: fc.sdpa_flop_count(q, k, v)
    if bwd is not None:
        out[bwd] = lambda g, q, k, v, *args, out_shape=None, **kw: fc.sdpa_backward_flop_count(g, q, k, v)
    return out


class Meter:
    """The one measurement and the samples counted since the first training batch (training thread
    writes, exporter thread reads plain numbers)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.samples = 0.0            # samples of every training batch fetched and trained on
        self.per_sample: float | None = None   # measured FLOPs per sample, once known
        self.cost_s: float | None = None       # the measured batch's seconds beyond the batch before it
        self._batches = 0
        self._mode = None
        self._opened: float | None = None      # clock when the latest batch was fetched
        self._before_s: float | None = None    # the unmeasured batch's interval
        self._measuring_samples = 0
        self._pending = 0                      # samples of the latest batch, counted at the next fetch or end
        self.failed = ""                       # why the measurement failed, if it did

    def fetched(self, batch: Any) -> None:
        """A training batch was fetched (None: the loader ended)."""
        now = self.clock()
        self.boundary(now)
        self.samples += self._pending   # the previous batch, trained on by now (as tokens are counted)
        self._pending = 0
        if batch is None:
            return
        n = self._pending = batch_samples(batch)
        self._batches += 1
        self._opened = now
        if self._batches == MEASURED_BATCH and n and self.per_sample is None and not self.failed:
            try:
                self._start(n)
            except Exception as exc:  # never let our bug reach the training loop: the formula stays
                self._fail(exc)

    def boundary(self, now: float | None = None) -> None:
        """The batch fetched last has been trained on (an optimizer step ended, or the next fetch)."""
        if self._opened is None:
            return
        now = self.clock() if now is None else now
        seconds, self._opened = now - self._opened, None
        if self._mode is not None:
            try:
                self._finish(seconds)
            except Exception as exc:  # never let our bug reach the training loop: the formula stays
                self._fail(exc)
        elif self.per_sample is None:
            self._before_s = seconds

    def _start(self, samples: int) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        self._mode = FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas())
        self._measuring_samples = samples
        self._mode.__enter__()

    def _finish(self, seconds: float) -> None:
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        total = float(mode.get_total_flops())
        self.per_sample = total / self._measuring_samples
        before = self._before_s
        self.cost_s = seconds - before if before is not None else seconds
        shown_before = f"{before:.3f} s" if before is not None else "not timed"
        log.warning("otel-gpu: model FLOPs measured with FlopCounterMode over one training batch: %.4g FLOPs, "
                    "%d samples, %.4g per sample; it cost %+.3f s (that batch %.3f s, the one before %s); "
                    "basis: %s", total, self._measuring_samples, self.per_sample, self.cost_s, seconds,
                    shown_before, BASIS_TEXT[BASIS_MEASURED])

    def _fail(self, exc: BaseException) -> None:
        self._mode, self.per_sample, self.failed = None, None, repr(exc)
        log.warning("otel-gpu: model FLOPs not measured (the formula is used where it fits): %r", exc)

    def flops(self) -> float | None:
        """Model FLOPs of the training batches fetched so far; None before the measurement."""
        return None if self.per_sample is None else self.per_sample * self.samples
