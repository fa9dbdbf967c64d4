"""PyTorch Lightning: a callback.

    trainer = L.Trainer(callbacks=[otel_gpu.training.lightning.OtelGpuCallback()])

A step is one training batch (`on_train_batch_start` .. `on_train_batch_end`), with
forward (batch start .. before backward), backward, optimizer (before optimizer
step .. batch end), eval (a validation pass: the fit loop's validation `run`, wrapped at
fit start, so the first batch of a validation set with no length, which Lightning fetches
ahead before `on_validation_start`, is eval and not data_wait; `on_validation_start` ..
`on_validation_end` for `trainer.validate`),
checkpoint (`trainer.save_checkpoint`, wrapped at fit start); samples are the batch's
leading dimension. Validation runs between training batches, so it is never step time.

The sanity check (`num_sanity_val_steps` batches of validation before the first training
batch) is set-up, like building the model: it is held as an eval pass that counts nowhere
(no step, no phase seconds, no collective wait), so that none of its parts (its batches,
its forwards through DDP, its metric all-reduce) is taken for data_wait or forward either.
Works with `lightning` and with the older `pytorch_lightning` package.
"""
from __future__ import annotations

from typing import Any

from . import session
from .wrap import phase_method

DRIVER = "lightning"


def batch_size(batch: Any) -> int | None:
    """Leading dimension of the first tensor in a batch (tensor, sequence or mapping)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_size(item)
            if n is not None:
                return n
    return None


class _Hooks:
    """The callback body, independent of which Lightning package provides the base class."""

    def on_fit_start(self, trainer, pl_module):
        session.model_seen(pl_module)
        phase_method(trainer, "save_checkpoint", "checkpoint")
        val_loop = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "val_loop", None)
        if val_loop is not None:
            phase_method(val_loop, "run", "eval")

    def on_sanity_check_start(self, trainer, pl_module):
        t = session.timer()
        if t is not None:
            t.enter("eval", counted=False)

    def on_sanity_check_end(self, trainer, pl_module):
        t = session.timer()
        if t is not None:
            t.exit("eval")

    def on_train_start(self, trainer, pl_module):
        t = session.timer()
        if t is not None:
            t.claim(DRIVER)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        t = session.timer()
        if t is not None:
            t.begin_step(DRIVER)
            t.enter("forward")

    def on_before_backward(self, trainer, pl_module, loss):
        t = session.timer()
        if t is not None:
            t.exit("forward")
            t.enter("backward")

    def on_after_backward(self, trainer, pl_module):
        t = session.timer()
        if t is not None:
            t.exit("backward")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        t = session.timer()
        if t is not None:
            t.enter("optimizer")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        t = session.timer()
        if t is not None:
            t.exit(t.current_phase() or "")   # forward (manual optimization) or optimizer
            t.end_step(DRIVER, samples=batch_size(batch))

    def on_exception(self, trainer, pl_module, exception):
        t = session.timer()
        if t is not None:
            t.unwind()

    def on_validation_start(self, trainer, pl_module):
        t = session.timer()
        if t is not None:
            t.enter("eval")

    def on_validation_end(self, trainer, pl_module):
        t = session.timer()
        if t is not None:
            t.exit("eval")


def callback_class(base: type) -> type:
    """The callback class for a given Lightning `Callback` base class."""
    return type("OtelGpuCallback", (_Hooks, base), {"__doc__": __doc__})


def _default_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback
    return Callback


def __getattr__(name: str):
    if name == "OtelGpuCallback":
        cls = callback_class(_default_base())
        globals()["OtelGpuCallback"] = cls
        return cls
    raise AttributeError(name)


def patch_trainer_class(module: Any) -> None:
    """Append the callback to every Lightning `Trainer` of `module` (`otel-gpu run`)."""
    cls = getattr(module, "Trainer", None)
    base = getattr(module, "Callback", None)
    if cls is None or base is None or getattr(cls.__init__, "_otelgpu", False):
        return
    original, callback = cls.__init__, callback_class(base)

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            if not any(isinstance(c, _Hooks) for c in self.callbacks):
                self.callbacks.append(callback())
        except Exception as exc:  # never break the user's Trainer
            session.log.warning("otel-gpu: Lightning Trainer not instrumented: %r", exc)

    __init__._otelgpu = True
    __init__.__wrapped__ = original
    cls.__init__ = __init__
