"""Watching a job while it runs: the diagnosis rules every few seconds over a sliding window.

A source gives the window that ends now: Prometheus / VictoriaMetrics (`PromSource`) or a recording
that `otel-gpu run` is still writing (`RecordingSource`). `Watcher.step` evaluates it, adds the
change-over-time check (slowdown.py) and hands the findings to the tracker (watch_state.py), which
decides what appeared, changed or cleared; only those are said. The source going away or the job
not having started yet is said once per change of state, never raised.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from .. import names as N
from . import run_rules
from .model import DiagnoseError, Window
from .slowdown import OwnBest
from .thresholds import Thresholds
from .watch_state import Tracker

DEFAULT_EVERY_S = 10.0
DEFAULT_LAST_S = 120.0
LATENCY_OFFSET = "1ms"   # VictoriaMetrics hides the newest 30 s unless a query asks (its least: 1 ms)
MIN_TRAINING_S = 20.0   # the rules judge a window once it holds this much training (first seconds are noise)


class SourceDown(RuntimeError):
    """The backend could not be read this time (one line); the watcher tries again."""


class RunEnded(RuntimeError):
    """The watched recording is closed: nothing more will come."""


class PromSource:
    """The window ending now, from a Prometheus-compatible server (newest samples included)."""

    def __init__(self, url: str, job: str | None, last_s: float, timeout: float, require_steps: bool = True):
        from ..promql import PromClient
        self.client = PromClient(url, timeout=timeout, params={"latency_offset": LATENCY_OFFSET})
        self.job, self.last_s, self.require_steps = job, last_s, require_steps
        self.what = f"{self.client.name} at {self.client.base_url}"

    def window(self, now: float) -> Window:
        from ..promql import PromError
        from .window import fetch_window
        try:
            w = fetch_window(self.client, self.job, now - self.last_s, now, require_steps=self.require_steps)
        except PromError as exc:
            raise SourceDown(str(exc)) from None
        if self.job is None and w.job:   # found the one job with steps: follow it from now on
            self.job = w.job
        return w

    def step_at(self, t: float) -> float | None:
        """The highest rank's step counter at `t` (unix s), None when unknown."""
        from ..promql import PromError
        from .queries import job_matcher, selector
        sel = selector(N.TRAIN_STEPS.prometheus_name(), job_matcher(self.job))
        try:
            got = self.client.query(f"max(last_over_time({sel}[5m]))", time=t)
        except PromError:
            return None
        return got[0].value if got else None

    def close(self) -> None:
        self.client.close()


class RecordingSource:
    """The window ending now, from the recording in `dirs` (being written or finished)."""

    def __init__(self, dirs: Sequence[str | Path], last_s: float, require_steps: bool = True):
        self.dirs, self.last_s, self.require_steps = list(dirs), last_s, require_steps
        self.what = "the recording in " + ", ".join(map(str, self.dirs))
        self.ended: float | None = None

    def window(self, now: float) -> Window:
        from ..record.reader import Recording, RecordingError
        from ..record.window import recorded_window
        try:
            with Recording.open(self.dirs) as rec:
                ends = [m.get("ended") for m in rec.metas]
                if all(ends):
                    self.ended = max(float(e) for e in ends)
                    now = min(now, self.ended)
                return recorded_window(rec, start=now - self.last_s, end=now, with_profile=False,
                                       require_steps=self.require_steps)
        except RecordingError as exc:
            raise SourceDown(str(exc)) from None
        except ValueError as exc:   # a damaged "ended" value
            raise SourceDown(f"unreadable recording: {exc}") from None

    def step_at(self, t: float) -> float | None:
        from ..record.reader import Recording, RecordingError
        try:
            with Recording.open(self.dirs) as rec:
                values = [s.points[-1][1] for s in rec.series(N.TRAIN_STEPS.name, t - 300.0, t)]
        except RecordingError:
            return None
        return max(values) if values else None

    def close(self) -> None:
        pass


def data_age(w: Window, now: float) -> float | None:
    """Seconds between `now` and the newest training (else GPU) point in the window."""
    lasts = [r.last_t for r in w.ranks if r.last_t is not None] or [g.last_t for g in w.gpus if g.last_t is not None]
    return max(0.0, now - max(lasts)) if lasts else None


@dataclass
class Watcher:
    """One evaluation per `step(now)`; `say` gets status lines, `emit` each event (a dict)."""
    source: PromSource | RecordingSource
    thresholds: Thresholds
    tracker: Tracker
    emit: Callable[[dict], None]
    say: Callable[[str], None]
    own_best: OwnBest = field(default_factory=OwnBest)
    state: str = ""          # "", "waiting", "down", "ok": said once per change
    evaluations: int = 0
    seconds: float = 0.0     # wall time spent evaluating, all evaluations

    def step(self, now: float) -> list[dict]:
        """Evaluate the window ending at `now` (unix s); the events decided."""
        t0 = time.perf_counter()
        try:
            return self._step(now)
        finally:
            self.evaluations += 1
            self.seconds += time.perf_counter() - t0

    def _step(self, now: float) -> list[dict]:
        try:
            w = self.source.window(now)
        except DiagnoseError as exc:
            self._status("waiting", f"waiting for data: {exc}")
            return []
        except SourceDown as exc:
            self._status("down", f"cannot read {self.source.what}: {exc}")
            return []
        age = data_age(w, now)
        if w.ranks and w.training_s() < min(MIN_TRAINING_S, 0.5 * w.duration_s):
            self._status("warming", f"warming up: {w.training_s():.0f} s of training so far; the rules judge "
                                    f"from {MIN_TRAINING_S:.0f} s on")
            return []
        if self.state != "ok":
            back = self.state == "down"
            self.state = "ok"
            self.say((f"{self.source.what} answers again" if back else f"watching {self.source.what}")
                     + (f" (job {w.job})" if w.job else "")
                     + (f"; newest sample {age:.1f} s old" if age is not None else ""))
        findings = run_rules(w, self.thresholds) + self.own_best.check(w, self.thresholds)
        events = self.tracker.update(now, [f.as_dict() for f in findings])
        for e in events:
            e["data_age_s"] = None if age is None else round(age, 3)
            since = (e.get("evidence") or {}).get("since") or e.get("first_seen_t")
            e["since"] = since
            if e["event"] == "appeared" and since is not None:
                e["step"] = self.source.step_at(since)
            self.emit(e)
        return events

    def _status(self, state: str, line: str) -> None:
        if state != self.state:
            self.state = state
            self.say(line)


def run_until(watcher: Watcher, every_s: float, stopped: Callable[[float], bool],
              clock: Callable[[], float] = time.time) -> None:
    """Evaluate every `every_s` seconds until `stopped(timeout)` (a wait that returns True when told
    to stop, e.g. threading.Event.wait) or the watched recording has ended."""
    while True:
        began = clock()
        watcher.step(began)
        ended = getattr(watcher.source, "ended", None)
        if ended is not None:
            watcher.say(f"the run ended at {_clock(ended)} UTC: watching stops")
            return
        if stopped(max(0.0, every_s - (clock() - began))):
            return


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")


def event_line(e: dict) -> str:
    """One event for the terminal: time, event, severity, rule, title, since when, where."""
    from ..safe_text import visible
    head = f"{_clock(e['t'])} {e['event']:<8} [{e['severity']}] {e['rule']}: {visible(e['title'])}"
    if e["event"] == "changed":
        head += f" (was {e['previous_severity']})"
    tail = []
    if e["event"] == "cleared":
        tail.append(f"gone for {e.get('absent_s', 0):.0f} s")
    elif e.get("since") is not None:
        step = e.get("step")
        tail.append(f"since {_clock(e['since'])} UTC" + (f", step {int(step):,}" if step is not None else ""))
    ranks = (e.get("where") or {}).get("ranks") or []
    if ranks:
        from .fmt import compact
        tail.append("rank " + visible(compact(ranks)) if len(ranks) == 1 else "ranks " + visible(compact(ranks)))
    if e.get("data_age_s") is not None and e["data_age_s"] >= 30:
        tail.append(f"newest sample {e['data_age_s']:.0f} s old")
    return head + ("; " + "; ".join(tail) if tail else "")
