"""Any torch optimizer, no code change: global optimizer-step hooks.

Each `optimizer.step()` is the "optimizer" phase and the end of a step; the step
time is the time between two optimizer steps (the first step only opens the
count). Used only while no higher integration (HF Trainer, Lightning, DeepSpeed,
`training.step()`) owns the step boundaries: those call the optimizer themselves.
"""
from __future__ import annotations

from . import session

DRIVER = "optimizer"
_handles: list = []


def _pre(optimizer, args, kwargs):
    t = session.timer()
    if t is not None and t.driver in (None, DRIVER):
        t.enter("optimizer")


def _post(optimizer, args, kwargs):
    t = session.timer()
    if t is not None and t.driver in (None, DRIVER):
        t.exit("optimizer")
        t.mark_step(DRIVER)


def install() -> bool:
    """Register the global hooks once; False when torch has no global optimizer hooks."""
    if _handles:
        return True
    from torch.optim import optimizer as opt

    if not hasattr(opt, "register_optimizer_step_pre_hook"):
        return False
    _handles.append(opt.register_optimizer_step_pre_hook(_pre))
    _handles.append(opt.register_optimizer_step_post_hook(_post))
    return True


def uninstall() -> None:
    while _handles:
        _handles.pop().remove()
