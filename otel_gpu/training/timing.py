"""Step and phase timing for one rank, on the host clock (no OpenTelemetry import).

`Timer` turns hook calls (step begin/end, phase enter/exit, time blocked in a
collective) into measurements handed to a `Sink`: step durations in seconds,
*exclusive* phase seconds (a phase nested in another is not counted twice, so the
phase shares of wall time add up to at most 1), checkpoint start/end events, and
seconds blocked in collectives inside counted steps, by kind and phase.

Several integrations can be active in one process (the Hugging Face Trainer
runs DeepSpeed's engine, which calls a torch optimizer). The one with the highest
priority that has spoken owns the step boundaries; the others only add phases.
Nothing here touches the GPU: times come from `time.perf_counter`.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

log = logging.getLogger("otel_gpu.training")

# Who may define step boundaries; a higher value wins.
DRIVER_PRIORITY = {"optimizer": 1, "deepspeed": 2, "lightning": 3, "hf": 3, "user": 4}


class Sink(Protocol):
    """Where measurements go (OTel instruments in production, a list in tests)."""

    def step(self, seconds: float, samples: float | None, tokens: float | None) -> None: ...

    def phase(self, name: str, seconds: float) -> None: ...

    def checkpoint(self, event: str) -> None: ...

    def collective(self, kind: str, phase: str, seconds: float) -> None: ...


class PhaseListener(Protocol):
    """Told the current phase of a thread (the profiler tags its samples with it)."""

    def phase_changed(self, old: str | None, new: str | None) -> None: ...


def _guarded(method):
    """Hooks run inside user code: an error in ours is logged once and turns the timer off."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.broken:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # never let our bug reach the training loop
            self.broken = True
            log.warning("otel-gpu training telemetry disabled after an internal error: %r", exc)
            return None

    return wrapper


@dataclass
class _Frame:
    name: str
    resumed: float      # perf_counter when this frame last became the innermost
    acc: float = 0.0    # exclusive seconds before `resumed`
    depth: int = 0      # re-entries of the same phase (DeepSpeed inside the HF Trainer)


class Timer:
    """Step/phase bookkeeping; every public method is cheap and never raises to callers."""

    def __init__(self, sink: Sink, listener: PhaseListener | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.sink = sink
        self.listener = listener
        self.clock = clock
        self.driver: str | None = None
        self._step_start: float | None = None
        self._local = threading.local()
        self.broken = False

    # ---- steps ------------------------------------------------------------
    @_guarded
    def claim(self, driver: str) -> bool:
        """True when `driver` owns step boundaries (taking them over if it ranks higher)."""
        current = self.driver
        if current == driver:
            return True
        if current is None or DRIVER_PRIORITY.get(driver, 0) > DRIVER_PRIORITY.get(current, 0):
            self.driver = driver
            self._step_start = None   # a lower driver's open step is dropped
            return True
        return False

    @_guarded
    def begin_step(self, driver: str) -> None:
        if self.claim(driver):
            self._step_start = self.clock()

    @_guarded
    def end_step(self, driver: str, samples: float | None = None, tokens: float | None = None) -> None:
        if self.driver != driver or self._step_start is None:
            return
        seconds = self.clock() - self._step_start
        self._step_start = None
        self.sink.step(seconds, samples, tokens)

    @_guarded
    def mark_step(self, driver: str, samples: float | None = None, tokens: float | None = None) -> None:
        """A step boundary for drivers that only see the end of each step (optimizer, DeepSpeed).

        The first mark opens the first step; each later one closes a step and opens the next.
        """
        if not self.claim(driver):
            return
        now = self.clock()
        if self._step_start is not None:
            self.sink.step(now - self._step_start, samples, tokens)
        self._step_start = now

    @_guarded
    def open_step_if_idle(self, driver: str) -> None:
        """Open a step at the first hook of a boundary-only driver (so step 1 is counted)."""
        if self._step_start is None and self.claim(driver):
            self._step_start = self.clock()

    def collective(self, kind: str, seconds: float) -> None:
        """This thread was blocked `seconds` in a collective of `kind` (all_reduce, all_gather, ...).
        Counted only inside a step, so it compares with step time; tagged with the current phase.
        (Called per collective: the guard is inlined rather than the `_guarded` wrapper.)"""
        if self._step_start is None or self.broken:
            return
        try:
            stack = getattr(self._local, "stack", None)
            self.sink.collective(kind, stack[-1].name if stack else "", seconds)
        except Exception as exc:  # never let our bug reach the training loop
            self.broken = True
            log.warning("otel-gpu training telemetry disabled after an internal error: %r", exc)

    @contextmanager
    def step(self, samples: float | None = None, tokens: float | None = None) -> Iterator[None]:
        self.begin_step("user")
        try:
            yield
        finally:
            self.end_step("user", samples, tokens)

    # ---- phases -----------------------------------------------------------
    def _stack(self) -> list[_Frame]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current_phase(self) -> str | None:
        stack = self._stack()
        return stack[-1].name if stack else None

    @_guarded
    def enter(self, name: str) -> None:
        now = self.clock()
        stack = self._stack()
        if stack:
            top = stack[-1]
            if top.name == name:
                top.depth += 1
                return
            top.acc += now - top.resumed
        stack.append(_Frame(name, now))
        if name == "checkpoint":
            self.sink.checkpoint("start")
        if self.listener is not None:
            self.listener.phase_changed(stack[-2].name if len(stack) > 1 else None, name)

    @_guarded
    def exit(self, name: str) -> None:
        stack = self._stack()
        if not stack or stack[-1].name != name:
            return  # unbalanced exit (an exception unwound past a hook): ignore
        top = stack[-1]
        if top.depth:
            top.depth -= 1
            return
        now = self.clock()
        stack.pop()
        self.sink.phase(name, top.acc + now - top.resumed)
        if name == "checkpoint":
            self.sink.checkpoint("end")
        parent = stack[-1] if stack else None
        if parent is not None:
            parent.resumed = now
        if self.listener is not None:
            self.listener.phase_changed(name, parent.name if parent else None)

    @_guarded
    def unwind(self) -> None:
        """Close every phase still open on this thread (after an exception skipped their exits)."""
        stack = self._stack()
        while stack:
            top = stack[-1]
            top.depth = 0
            self.exit(top.name)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.exit(name)
