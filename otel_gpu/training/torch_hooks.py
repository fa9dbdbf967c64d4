"""Plain PyTorch, no code change: optimizer steps, backward passes and DataLoader batches.

Each `optimizer.step()` is the "optimizer" phase and the end of a step; the step time is the
time between two optimizer steps (the first step only opens the count). Used for step
boundaries only while no higher integration (HF Trainer, Lightning, DeepSpeed,
`training.step()`) owns them: those call the optimizer themselves.

Whoever owns the steps, `torch.autograd.backward` (what `loss.backward()` calls) is the
"backward" phase, getting the next batch from a DataLoader is the "data_wait" phase (not
inside "eval": evaluation batches stay eval time; a loader iterated for an evaluation opens it,
see `forward.before_fetch`), `torch.save` is a checkpoint save
(the frameworks' own save functions, which call it, are one save) and the model call of a
loop that no integration times is the "forward" phase (`forward`), or opens an evaluation pass
("eval") when the model is called without gradients or in eval mode; a backward pass, an
optimizer step or a training batch's fetch ends that pass. A training batch's non-padding tokens
are counted from the batch the loader returned, on the host, before the program moves it (`tokens`),
at the iterator's next fetch or end (a batch fetched ahead and never trained is not counted; a loop
that breaks out after training on a batch leaves that last batch uncounted).

Telemetry starts when a DataLoader iterator is made (`iter(loader)`, set-up), so its start-up
is not in the first batch that the program times.
"""
from __future__ import annotations

import functools

from . import forward, session, tokens

DRIVER = "optimizer"
_handles: list = []
_patched: list = []   # (owner, attribute, original)


def _pre(optimizer, args, kwargs):
    t = session.timer()
    if t is None:
        return
    if forward.eval_open():
        forward.end_eval(t)
    if t.driver in (None, DRIVER):
        t.enter("optimizer")


def _post(optimizer, args, kwargs):
    t = session.timer()
    meter = getattr(t.sink, "flops_meter", None) if t is not None else None
    if meter is not None:   # OTELGPU_FLOPS=measure: the batch measured ends with the optimizer step
        meter.boundary()
    if t is not None and t.driver in (None, DRIVER):
        t.exit("optimizer")
        t.mark_step(DRIVER)


def _phase(original, name: str, unless: str | None = None, before=None):
    """`original` timed as phase `name` (not while the thread is in phase `unless`); `before(timer)`
    runs first while a plain loop's evaluation pass is open (it may end the pass)."""

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        t = session.timer()
        if t is None:
            return original(*args, **kwargs)
        if before is not None and forward.eval_open():
            before(t)
        if unless is not None and t.current_phase() == unless:
            return original(*args, **kwargs)
        t.enter(name)
        try:
            return original(*args, **kwargs)
        finally:
            t.exit(name)

    wrapper._otelgpu = True
    return wrapper


def _patch(owner, attr: str, name: str, unless: str | None = None, before=None) -> None:
    original = getattr(owner, attr, None)
    if original is None or getattr(original, "_otelgpu", False):
        return
    setattr(owner, attr, _phase(original, name, unless, before))
    _patched.append((owner, attr, original))


def _next(original):
    """`_BaseDataLoaderIter.__next__` as data_wait, except in an evaluation pass (its batches are eval
    time); a plain loop's pass may end or begin at the fetch (`forward.before_fetch`)."""

    @functools.wraps(original)
    def __next__(self):
        t = session.timer()
        if t is None:
            return original(self)
        dataset = getattr(self, "_dataset", None)
        forward.before_fetch(t, dataset)
        if t.current_phase() == "eval":
            return original(self)
        forward.training_data(dataset)
        t.enter("data_wait")
        try:
            batch = original(self)
        except StopIteration:
            _count(t, self, None)
            raise
        finally:
            t.exit("data_wait")
        _count(t, self, batch)
        return batch

    __next__._otelgpu = True
    return __next__


def _count(t, iterator, batch) -> None:
    """The non-padding tokens of `iterator`'s previous training batch to the sink, `batch`'s kept until the
    next fetch or the end of the iterator (None: it ended): a wrapper that fetches one batch ahead
    (accelerate's DataLoaderShard under the HF Trainer, Lightning's prefetch) leaves its last batch
    untrained when training stops mid-epoch, and that batch is not counted. Host tensors only (`tokens`)."""
    if t.broken:
        return
    try:
        pending = getattr(iterator, "_otelgpu_tokens", None)
        fetched = getattr(t.sink, "fetched", None)
        if pending is not None and fetched is not None:
            fetched(*pending)
        iterator._otelgpu_tokens = tokens.batch_tokens(batch) if batch is not None else None
        meter = getattr(t.sink, "flops_meter", None)
        if meter is not None:   # OTELGPU_FLOPS=measure (flops_measure.py)
            meter.fetched(batch)
    except Exception as exc:  # never let our bug reach the training loop
        t.broken = True
        session.log.warning("otel-gpu training telemetry disabled after an internal error: %r", exc)


def _start_at_iter(original):
    """`DataLoader.__iter__` that starts telemetry once the iterator exists (after its workers are
    forked), so the start-up is paid in set-up, not in the first `next()`; a plain loop's evaluation
    pass may end or begin before it (the start-up of an evaluation's loader is the evaluation's)."""

    @functools.wraps(original)
    def __iter__(self):
        s = session._session
        if s is not None:
            forward.before_fetch(s.timer, getattr(self, "dataset", None))
        iterator = original(self)
        session.current()
        return iterator

    __iter__._otelgpu = True
    return __iter__


def install_phases() -> None:
    """data_wait around DataLoader iteration, backward around `torch.autograd.backward`, checkpoint
    around `torch.save`, forward (or eval) around the model call (`forward.install`); telemetry
    started at `iter(DataLoader)`."""
    import torch
    import torch.autograd
    from torch.utils.data import dataloader

    original = getattr(dataloader._BaseDataLoaderIter, "__next__", None)
    if original is not None and not getattr(original, "_otelgpu", False):
        dataloader._BaseDataLoaderIter.__next__ = _next(original)
        _patched.append((dataloader._BaseDataLoaderIter, "__next__", original))
    _patch(torch.autograd, "backward", "backward", before=forward.end_eval)
    _patch(torch, "save", "checkpoint")
    original = getattr(dataloader.DataLoader, "__iter__", None)
    if original is not None and not getattr(original, "_otelgpu", False):
        dataloader.DataLoader.__iter__ = _start_at_iter(original)
        _patched.append((dataloader.DataLoader, "__iter__", original))
    forward.install()


def install() -> bool:
    """Register the global optimizer hooks and the phases above once; False when torch has no
    global optimizer hooks."""
    install_phases()
    if _handles:
        return True
    from torch.optim import optimizer as opt

    if not hasattr(opt, "register_optimizer_step_pre_hook"):
        return False
    _handles.append(opt.register_optimizer_step_pre_hook(_pre))
    _handles.append(opt.register_optimizer_step_post_hook(_post))
    return True


def uninstall() -> None:
    forward.uninstall()
    while _handles:
        _handles.pop().remove()
    while _patched:
        owner, attr, original = _patched.pop()
        setattr(owner, attr, original)
