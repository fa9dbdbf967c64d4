"""Hugging Face `Trainer` (and LLaMA-Factory, which runs on it).

    trainer = Trainer(...)
    otel_gpu.training.hf.instrument(trainer)     # or: callbacks=[OtelGpuCallback()]

`instrument` adds the callback (steps between `on_step_begin` and `on_step_end`,
the optimizer phase) and times the trainer's own methods: `get_batch_samples`
(data_wait), `compute_loss` (forward), `accelerator.backward` (backward),
`_save_checkpoint` (checkpoint), `evaluate` (eval); samples come from each batch's
`input_ids` shape (no GPU sync); non-padding tokens are counted where the DataLoader
returns the batch (`torch_hooks`, `tokens`). The callback alone gives steps, the
optimizer phase and samples from the batch-size arguments.
"""
from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from . import session
from .wrap import phase_method

DRIVER = "hf"


class OtelGpuCallback(TrainerCallback):
    """Step boundaries and the optimizer phase from the Trainer's callback events."""

    def __init__(self):
        self.samples = 0      # counted from batches by instrument(); 0: use the arguments

    def on_train_begin(self, args, state, control, **kwargs):
        t = session.timer()
        if t is not None:
            t.claim(DRIVER)

    def on_step_begin(self, args, state, control, **kwargs):
        t = session.timer()
        if t is not None:
            t.begin_step(DRIVER)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        t = session.timer()
        if t is not None:
            t.enter("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        t = session.timer()
        if t is not None:
            t.exit("optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        t = session.timer()
        if t is None:
            return
        samples = self.samples or args.per_device_train_batch_size * args.gradient_accumulation_steps
        t.end_step(DRIVER, samples=samples)
        self.samples = 0


def _count_batch(callback: OtelGpuCallback):
    def count(model, inputs, *args, **kwargs):
        ids = inputs.get("input_ids") if hasattr(inputs, "get") else None
        shape = getattr(ids, "shape", None)
        if shape is not None and len(shape) >= 1:
            callback.samples += int(shape[0])
    return count


def instrument(trainer: Any) -> Any:
    """Add the callback and time the trainer's phases (instance attributes only); returns it."""
    if getattr(trainer, "_otelgpu_instrumented", False):
        return trainer
    callback = OtelGpuCallback()
    trainer.add_callback(callback)
    phase_method(trainer, "training_step", None, before=_count_batch(callback))
    phase_method(trainer, "get_batch_samples", "data_wait")
    phase_method(trainer, "compute_loss", "forward", skip_inside=("eval",))
    phase_method(trainer, "_save_checkpoint", "checkpoint")
    phase_method(trainer, "evaluate", "eval")
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None:
        phase_method(accelerator, "backward", "backward")
    session.model_seen(getattr(trainer, "model", None))
    trainer._otelgpu_instrumented = True
    return trainer


def patch_trainer_class(module: Any) -> None:
    """Make every `Trainer` (and subclass) instrument itself at the end of `__init__` (`otel-gpu run`)."""
    cls = getattr(module, "Trainer", None)
    if cls is None or getattr(cls.__init__, "_otelgpu", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            instrument(self)
        except Exception as exc:  # never break the user's Trainer
            session.log.warning("otel-gpu: Trainer not instrumented: %r", exc)

    __init__._otelgpu = True
    __init__.__wrapped__ = original
    cls.__init__ = __init__
