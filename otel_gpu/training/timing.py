"""Step and phase timing for one rank, on the host clock (no OpenTelemetry import).

`Timer` turns hook calls (step begin/end, phase enter/exit, `wait_begin`/`wait_end` around
time blocked in a collective) into measurements handed to a `Sink`: step durations in seconds,
*exclusive* phase seconds (a phase nested in another is not counted twice, so the
phase shares of wall time add up to at most 1), checkpoint start/end events, and
seconds blocked in collectives, by kind and phase.

A collective is waiting, not work: the seconds a thread is blocked in one are taken out of the
phase it happens in (the phase keeps its *own* time) and counted as collective wait under that
phase's name, wherever it happens (a framework's batch fetch that all-gathers token counts, a
metric all-reduce in the user's logging, a barrier inside a save), inside a step or between steps
while a phase is open. A collective outside every phase counts only inside a step (a set-up
barrier before training is nobody's wait). So no phase grows because its rank waited for another.

Phase time is also readable while phases are open: `phase_totals()` (called by the exporter
at each collection) gives every phase's exclusive seconds so far, open phases included up to
now, so a 3 s save spanning three exports adds about 1 s to each instead of 3 s at its end.
The training thread never takes a lock for it: each thread's bookkeeping carries a generation
number, odd while it changes, and the reader retries until it reads a thread between changes.

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
    resumed: float      # perf_counter when this frame last became the innermost (or its thread's wait ended)
    acc: float = 0.0    # exclusive seconds before `resumed`
    depth: int = 0      # re-entries of the same phase (DeepSpeed inside the HF Trainer)
    start: float = 0.0  # perf_counter when the phase was entered (its wall time, nested phases included)
    counted: bool = True  # False: held open so hooks keep out, its seconds and waits counted nowhere (set-up)
    waited: float = 0.0   # collective wait seconds attributed to this frame (an eval frame: not step time)
    live: bool = True     # still on its thread's stack


class _Thread:
    """One thread's phases: the open frames and the closed totals, written by that thread only."""

    __slots__ = ("stack", "closed", "gen", "thread", "waiting", "open")

    def __init__(self):
        self.stack: list[_Frame] = []
        self.closed: dict[str, float] = {}   # phase -> exclusive seconds of the phases that ended
        self.gen = 0                         # odd while the owner changes stack/closed
        self.thread = threading.current_thread()
        self.waiting = 0                     # collective waits open on this thread: no frame counts own time
        self.open: tuple | None = None       # (kind, clock) of the outermost wait open now (read by the exporter)


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
        self.boundaries = 0                  # step boundaries seen (ends of steps), for one-off set-up
        self._step_thread: int | None = None  # the thread that opened the current step
        self._threads: list[_Thread] = []    # every thread that entered a phase (see phase_totals)
        self._register = threading.Lock()    # taken once per thread, at its first phase
        self._read = threading.Lock()        # readers only (one collection at a time)
        self._retired: dict[str, float] = {}  # closed totals of threads that ended
        self._reported: dict[str, float] = {}  # last phase_totals(): never go below it
        self.step_listener = None            # told each step's opening and close (trace_capture.Capture)

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
            self._step_thread = threading.get_ident()
            if self.step_listener is not None:
                self.step_listener.step_opened()

    @_guarded
    def end_step(self, driver: str, samples: float | None = None, tokens: float | None = None) -> None:
        if self.driver != driver or self._step_start is None:
            return
        seconds = self.clock() - self._step_start
        self._step_start = None
        self.boundaries += 1
        self.sink.step(seconds, samples, tokens)
        if self.step_listener is not None:
            self.step_listener.step_closed(seconds)

    @_guarded
    def mark_step(self, driver: str, samples: float | None = None, tokens: float | None = None) -> None:
        """A step boundary for drivers that only see the end of each step (optimizer, DeepSpeed).

        The first mark opens the first step; each later one closes a step and opens the next.
        """
        if not self.claim(driver):
            return
        now = self.clock()
        self.boundaries += 1
        listener = self.step_listener
        if self._step_start is not None:
            self.sink.step(now - self._step_start, samples, tokens)
            if listener is not None:
                listener.step_closed(now - self._step_start)
        self._step_start = now
        self._step_thread = threading.get_ident()
        if listener is not None:
            listener.step_opened()

    @_guarded
    def open_step_if_idle(self, driver: str) -> None:
        """Open a step at the first hook of a boundary-only driver (so step 1 is counted)."""
        if self._step_start is None and self.claim(driver):
            self._step_start = self.clock()
            self._step_thread = threading.get_ident()
            if self.step_listener is not None:
                self.step_listener.step_opened()

    def wait_begin(self, kind: str | None = None) -> tuple:
        """This thread starts blocking in a collective (of `kind`, when known now): no phase of it counts own
        time (live reads too) until `wait_end`, a phase entered meanwhile included; the outermost wait's kind
        and start are kept for `open_waits`. Returns the token to hand to `wait_end`: (the thread's state, its
        innermost frame now or None, the clock reading). Called per collective: the guard is inlined rather
        than the `_guarded` wrapper."""
        if self.broken:
            return (None, None, self.clock())
        try:
            st = getattr(self._local, "st", None) or self._state()
            stack = st.stack
            top = stack[-1] if stack else None
            st.gen += 1
            now = self.clock()
            if not st.waiting:
                if top is not None:
                    top.acc += now - top.resumed
                st.open = (kind, now)
            st.waiting += 1
            st.gen += 1
            return (st, top, now)
        except Exception as exc:  # never let our bug reach the training loop
            self.broken = True
            log.warning("otel-gpu training telemetry disabled after an internal error: %r", exc)
            return (None, None, self.clock())

    def wait_end(self, kind: str | None, token: tuple, before: float = 0.0) -> float:
        """The wait that `wait_begin` returned `token` for is over: the thread's innermost phase counts own
        time again, and (unless `kind` is None: a call whose wait comes later) `before + seconds waited` are
        the rank's collective wait of `kind` under the phase that was innermost when the wait began (when
        that phase ended meanwhile: under the innermost one now; outside every phase: only inside a step).
        Returns the seconds waited; never raises."""
        try:
            st, frame, began = token
            now = self.clock()
            seconds = now - began
            if self.broken or st is None:
                return seconds
            if st.waiting > 0:
                st.gen += 1
                st.waiting -= 1
                if not st.waiting:
                    st.open = None
                    if st.stack:
                        st.stack[-1].resumed = now
                st.gen += 1
            if kind is not None:
                if frame is not None and not frame.live:
                    frame = st.stack[-1] if st.stack else None
                if frame is not None:
                    frame.waited += before + seconds
                    if frame.counted:
                        self.sink.collective(kind, frame.name, before + seconds)
                elif self._step_start is not None:
                    self.sink.collective(kind, "", before + seconds)
            return seconds
        except Exception as exc:  # never let our bug reach the training loop
            self.broken = True
            log.warning("otel-gpu training telemetry disabled after an internal error: %r", exc)
            return 0.0

    @contextmanager
    def step(self, samples: float | None = None, tokens: float | None = None) -> Iterator[None]:
        self.begin_step("user")
        try:
            yield
        finally:
            self.end_step("user", samples, tokens)

    # ---- phases -----------------------------------------------------------
    def _state(self) -> _Thread:
        st = getattr(self._local, "st", None)
        if st is None:
            st = self._local.st = _Thread()
            with self._register:
                self._threads.append(st)
        return st

    def _stack(self) -> list[_Frame]:
        return self._state().stack

    def current_phase(self) -> str | None:
        st = getattr(self._local, "st", None)
        return st.stack[-1].name if st is not None and st.stack else None

    @_guarded
    def enter(self, name: str, counted: bool = True) -> None:
        """Open phase `name` on this thread; `counted=False`: a set-up pass (Lightning's sanity check) held
        as that phase so that no hook takes its parts for another, its seconds and waits counted nowhere."""
        st = getattr(self._local, "st", None) or self._state()
        stack = st.stack
        if stack and stack[-1].name == name:
            stack[-1].depth += 1
            return
        st.gen += 1   # odd from before the clock is read: a reader never counts past `now`
        now = self.clock()
        if stack and not st.waiting:
            top = stack[-1]
            top.acc += now - top.resumed
        stack.append(_Frame(name, now, start=now, counted=counted))
        st.gen += 1
        if name == "checkpoint":
            self.sink.checkpoint("start")
        if self.listener is not None:
            self.listener.phase_changed(stack[-2].name if len(stack) > 1 else None, name)

    @_guarded
    def exit(self, name: str) -> None:
        st = getattr(self._local, "st", None) or self._state()
        stack = st.stack
        if not stack or stack[-1].name != name:
            return  # unbalanced exit (an exception unwound past a hook): ignore
        top = stack[-1]
        if top.depth:
            top.depth -= 1
            return
        st.gen += 1
        now = self.clock()
        seconds = top.acc + (now - top.resumed if not st.waiting else 0.0)
        stack.pop()
        top.live = False
        if top.counted:
            st.closed[name] = st.closed.get(name, 0.0) + seconds
        if name == "eval" and self._step_start is not None and self._step_thread == threading.get_ident():
            # evaluation is not step time: its own seconds and its waits leave the step; what else ran inside
            # its wall time (a save, a phase of the job's own, a wait that began before it) stays, as counted
            self._step_start += max(0.0, min(seconds + top.waited, now - self._step_start))
        parent = stack[-1] if stack else None
        if parent is not None:
            parent.resumed = now
        st.gen += 1
        if top.counted:
            self.sink.phase(name, seconds)
        if name == "checkpoint":
            self.sink.checkpoint("end")
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

    # ---- reading (exporter thread) -------------------------------------------
    def open_waits(self) -> dict[str, float]:
        """Collective kind ("" when not known) -> seconds the longest outermost wait of that kind still open
        on any thread has lasted, now; empty when no thread is inside one. A wait inside another counts once."""
        now = self.clock()
        out: dict[str, float] = {}
        for st in list(self._threads):
            got = st.open
            if got is not None:
                kind, since = got
                kind = kind or ""
                out[kind] = max(out.get(kind, 0.0), now - since)
        return out

    def phase_totals(self, tries: int = 50) -> dict[str, float]:
        """Exclusive seconds per phase over every thread: phases that ended plus the open ones up
        to now. Never lower than the previous answer (monotone, for a cumulative counter); when a
        consistent read is not had in `tries` attempts, the previous answer again."""
        with self._read:
            try:
                totals = self._read_totals(tries)
            except Exception as exc:  # a reader bug must not break the export (nor the training)
                log.warning("otel-gpu: open phase time not read: %r", exc)
                totals = None
            last = self._reported
            if totals is None:
                return dict(last)
            for name, value in last.items():
                if totals.get(name, 0.0) < value:
                    totals[name] = value
            self._reported = totals
            return dict(totals)

    def _read_totals(self, tries: int) -> dict[str, float] | None:
        for _ in range(tries):
            threads = list(self._threads)
            gens = [st.gen for st in threads]
            if any(g & 1 for g in gens):
                time.sleep(0)   # a thread is between two changes: let it finish
                continue
            now = self.clock()
            totals = dict(self._retired)
            for st in threads:
                for name, value in list(st.closed.items()):
                    totals[name] = totals.get(name, 0.0) + value
                stack = list(st.stack)
                for i, f in enumerate(stack):
                    if not f.counted:
                        continue
                    open_s = f.acc + (now - f.resumed if i == len(stack) - 1 and not st.waiting else 0.0)
                    totals[f.name] = totals.get(f.name, 0.0) + max(open_s, 0.0)
            if [st.gen for st in threads] != gens:
                time.sleep(0)
                continue
            self._retire(threads)
            return totals
        return None

    def _retire(self, threads: list[_Thread]) -> None:
        """Fold the closed totals of threads that ended into one dict (their open frames, never to
        close, are dropped) so the list stays as long as the live threads."""
        dead = [st for st in threads if not st.thread.is_alive() and not st.gen & 1]
        if not dead:
            return
        for st in dead:
            for name, value in st.closed.items():
                self._retired[name] = self._retired.get(name, 0.0) + value
        with self._register:
            self._threads = [st for st in self._threads if st not in dead]
