"""DeepSpeed: time an engine's forward, backward, step and save_checkpoint.

    engine, optimizer, _, _ = deepspeed.initialize(...)
    otel_gpu.training.deepspeed.instrument(engine)

A step ends at each `engine.step()` on a gradient-accumulation boundary; samples per
step are micro batch x accumulation steps of this rank. Under `otel-gpu run`,
`deepspeed.initialize` is wrapped so every engine is instrumented without code change.
"""
from __future__ import annotations

import functools
from typing import Any

from . import session
from .wrap import phase_method

DRIVER = "deepspeed"


def instrument(engine: Any) -> Any:
    """Wrap `engine`'s methods (instance attributes only); returns the engine."""
    t = session.timer()
    if t is None or getattr(engine, "_otelgpu_instrumented", False):
        return engine
    t.claim(DRIVER)
    boundary = {"now": False}

    def open_step(*args, **kwargs):
        session.timer().open_step_if_idle(DRIVER)

    def before_step(*args, **kwargs):
        boundary["now"] = bool(engine.is_gradient_accumulation_boundary())

    def after_step(result):
        if boundary["now"]:
            samples = engine.train_micro_batch_size_per_gpu() * engine.gradient_accumulation_steps()
            session.timer().mark_step(DRIVER, samples=samples)

    phase_method(engine, "forward", "forward", before=open_step)
    phase_method(engine, "backward", "backward")
    phase_method(engine, "step", "optimizer", before=before_step, after=after_step)
    phase_method(engine, "save_checkpoint", "checkpoint")
    if hasattr(engine, "eval_batch"):   # pipeline engines
        phase_method(engine, "eval_batch", "eval")
    session.model_seen(getattr(engine, "module", None))
    engine._otelgpu_instrumented = True
    return engine


def patch_initialize(module: Any) -> None:
    """Make `deepspeed.initialize` instrument the engine it returns (for `otel-gpu run`)."""
    original = getattr(module, "initialize", None)
    if original is None or getattr(original, "_otelgpu", False):
        return

    @functools.wraps(original)
    def initialize(*args, **kwargs):
        result = original(*args, **kwargs)
        engine = result[0] if isinstance(result, tuple) else result
        _safe_instrument(engine)
        return result

    initialize._otelgpu = True
    module.initialize = initialize


def _safe_instrument(engine: Any) -> None:
    try:
        instrument(engine)
    except Exception as exc:  # never break the user's initialize()
        session.log.warning("otel-gpu: DeepSpeed engine not instrumented: %r", exc)
