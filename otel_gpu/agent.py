"""The node agent: sources -> store -> OpenTelemetry instruments -> exporters.

The only OTel-aware part of the agent. Each source is read on its own thread at
the sampling interval, so a slow or hung source (a lost GPU) never delays the
others, and export (its own SDK thread) never blocks sampling.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from opentelemetry.metrics import CallbackOptions, Observation

from . import names
from .readings import MetricSpec, Reading, Source, SourceError
from .store import Store

log = logging.getLogger("otel_gpu.agent")


@dataclass
class SourceHealth:
    """Per-source health, exported as `otelgpu.agent.source.*`."""
    up: bool = False
    duration_s: float = 0.0
    errors: int = 0          # whole-source failures; partial ones come from the source
    last_error: str = ""


@dataclass
class Sampler:
    """Reads every source each `interval_s` seconds into `store`, one thread per source."""
    sources: Sequence[Source]
    store: Store
    interval_s: float
    clock: Callable[[], float] = time.monotonic
    health: dict[str, SourceHealth] = field(default_factory=dict)
    rounds: int = 0
    overruns: int = 0

    def __post_init__(self):
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._count_lock = threading.Lock()
        for s in self.sources:
            self.health[s.name] = SourceHealth()

    def read_once(self, source: Source) -> list[Reading]:
        """One read of `source` into the store; failures become health data, never exceptions."""
        health = self.health[source.name]
        start = self.clock()
        try:
            readings = source.read()
        except SourceError as exc:
            readings, health.up, health.last_error = [], False, str(exc)
            health.errors += 1
            self.store.forget(source.name)
        except Exception as exc:  # a source bug must not stop the agent; it is counted and shown
            readings, health.up, health.last_error = [], False, f"{type(exc).__name__}: {exc}"
            health.errors += 1
            log.warning("source %s failed: %s", source.name, health.last_error)
            self.store.forget(source.name)
        else:
            health.up = True
            self.store.put(source.name, readings, self.clock())
        health.duration_s = self.clock() - start
        return readings

    def _loop(self, source: Source) -> None:
        next_t = self.clock()
        while not self._stop.is_set():
            self.read_once(source)
            next_t += self.interval_s
            now = self.clock()
            with self._count_lock:
                self.rounds += 1
                if now > next_t:
                    self.overruns += 1
            if now > next_t:  # fell behind: skip missed ticks rather than bursting
                next_t = now
            self._stop.wait(max(0.0, next_t - now))

    def start(self) -> None:
        for s in self.sources:
            t = threading.Thread(target=self._loop, args=(s,), name=f"otelgpu-{s.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


class Instruments:
    """Observable instruments for every spec, fed from the store and the sampler's health."""

    def __init__(self, meter, sampler: Sampler, point_attrs: dict[str, str], export_failures: Callable[[], int]):
        self._sampler = sampler
        self._store = sampler.store
        self._point = point_attrs
        self._export_failures = export_failures
        health = {names.SOURCE_UP, names.SOURCE_DURATION, names.SOURCE_ERRORS,
                  names.EXPORT_FAILURES, names.SAMPLES, names.SAMPLE_LAG}
        for spec in names.all_specs():
            if spec.kind == "histogram" or spec.name.startswith(names.PREFIX + "train."):
                continue  # recorded by the training hooks, not observed here
            if spec in health:
                self._create(meter, spec, self._health_callback(spec))
                continue
            self._create(meter, spec, self._latest_callback(spec))
            if spec.windowed:
                lo, hi = names.windowed_companions(spec)
                self._create(meter, lo, self._window_callback(spec, 1))
                self._create(meter, hi, self._window_callback(spec, 2))

    @staticmethod
    def _create(meter, spec: MetricSpec, callback) -> None:
        factory = {"gauge": meter.create_observable_gauge,
                   "counter": meter.create_observable_counter,
                   "updowncounter": meter.create_observable_up_down_counter}[spec.kind]
        factory(spec.name, callbacks=[callback], unit=spec.unit, description=spec.description)

    def _attrs(self, key) -> dict[str, str]:
        return {**self._point, **dict(key)}

    def _latest_callback(self, spec: MetricSpec):
        def callback(options: CallbackOptions):
            if spec.windowed:  # the exported value is the mean over the window
                now = self._sampler.clock()
                return [Observation(mean, self._attrs(k)) for mean, _, _, k in self._store.window(spec.name, now)]
            return [Observation(v, self._attrs(k)) for v, k in self._store.latest(spec.name)]
        return callback

    def _window_callback(self, spec: MetricSpec, index: int):
        def callback(options: CallbackOptions):
            now = self._sampler.clock()
            return [Observation(row[index], self._attrs(row[3])) for row in self._store.window(spec.name, now)]
        return callback

    def _health_callback(self, spec: MetricSpec):
        def callback(options: CallbackOptions):
            s = self._sampler
            if spec is names.EXPORT_FAILURES:
                return [Observation(self._export_failures(), self._point)]
            if spec is names.SAMPLES:
                return [Observation(s.rounds, self._point)]
            if spec is names.SAMPLE_LAG:
                return [Observation(s.overruns, self._point)]
            out = []
            for src in s.sources:
                h = s.health[src.name]
                value = {names.SOURCE_UP: float(h.up), names.SOURCE_DURATION: h.duration_s,
                         names.SOURCE_ERRORS: h.errors + getattr(src, "partial_errors", 0)}[spec]
                out.append(Observation(value, {**self._point, names.SOURCE: src.name}))
            return out
        return callback
