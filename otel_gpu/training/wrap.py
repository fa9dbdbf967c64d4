"""Wrap a bound method of one object in a phase (instance attribute; the class is untouched)."""
from __future__ import annotations

import functools
from typing import Any, Callable

from . import session

_MARK = "__otelgpu_phase__"


def phase_method(obj: Any, name: str, phase: str | None, before: Callable | None = None,
                 after: Callable | None = None, skip_inside: tuple[str, ...] = ()) -> bool:
    """Replace `obj.name` by a wrapper timing it as `phase`; False if missing or already wrapped.

    `phase=None` only runs `before`/`after`. Inside a phase listed in `skip_inside` the
    call is not timed (the HF Trainer's compute_loss during evaluation stays "eval").

    `before(*args, **kwargs)` / `after(result)` run around the call (for step boundaries);
    they must be cheap and are kept from raising into the caller by the Timer.
    """
    method = getattr(obj, name, None)
    if method is None or getattr(method, _MARK, False):
        return False

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        t = session.timer()
        if t is None:
            return method(*args, **kwargs)
        if before is not None:
            _quiet(t, before, *args, **kwargs)
        if phase is None or (skip_inside and t.current_phase() in skip_inside):
            result = method(*args, **kwargs)
        else:
            t.enter(phase)
            try:
                result = method(*args, **kwargs)
            finally:
                t.exit(phase)
        if after is not None:
            _quiet(t, after, result)
        return result

    setattr(wrapper, _MARK, True)
    setattr(obj, name, wrapper)
    return True


def _quiet(t, fn, *args, **kwargs) -> None:
    if t.broken:
        return
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # our bookkeeping must never break the user's call
        t.broken = True
        session.log.warning("otel-gpu training telemetry disabled after an internal error: %r", exc)
