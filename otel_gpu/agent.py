"""The node agent: sources -> store -> exported families -> OTel instruments (OTLP) / scrape endpoint.

The only OTel-aware part of the agent. Each source is read on its own thread at
the sampling interval, so a slow or hung source (a lost GPU) never delays the
others, and export (the SDK's own thread, or a scrape) never blocks sampling.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

from opentelemetry.metrics import CallbackOptions, Observation

from . import names
from .readings import MetricSpec, Reading, Source, SourceError
from .store import Attrs, Store

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


Values = list[tuple[float, Attrs]]


class Exported:
    """Every series family the agent exports, as (spec, values) pairs read at export time.

    Shared by the OTel instruments (OTLP) and the Prometheus exposition, so both paths
    export the same families with the same values.
    """

    def __init__(self, sampler: Sampler, export_failures: Callable[[], int] = lambda: 0):
        self._sampler = sampler
        self._store = sampler.store
        self._export_failures = export_failures
        health = {names.SOURCE_UP: self._source_health, names.SOURCE_DURATION: self._source_health,
                  names.SOURCE_ERRORS: self._source_health, names.EXPORT_FAILURES: self._agent_health,
                  names.SAMPLES: self._agent_health, names.SAMPLE_LAG: self._agent_health}
        self.families: list[tuple[MetricSpec, Callable[[], Values]]] = []
        for spec in names.all_specs():
            if spec.kind == "histogram" or spec.name.startswith(names.PREFIX + "train."):
                continue  # recorded by the training hooks, not observed here
            if spec in health:
                self.families.append((spec, partial(health[spec], spec)))
            elif spec.windowed:  # the gauge is the mean over the window, with min / max companions
                lo, hi = names.windowed_companions(spec)
                self.families += [(spec, partial(self._window, spec, 0)), (lo, partial(self._window, spec, 1)),
                                  (hi, partial(self._window, spec, 2))]
            else:
                self.families.append((spec, partial(self._latest, spec)))

    def _latest(self, spec: MetricSpec) -> Values:
        return list(self._store.latest(spec.name))

    def _window(self, spec: MetricSpec, index: int) -> Values:
        return [(row[index], row[3]) for row in self._store.window(spec.name, self._sampler.clock())]

    def _agent_health(self, spec: MetricSpec) -> Values:
        s = self._sampler
        value = {names.EXPORT_FAILURES: self._export_failures, names.SAMPLES: lambda: s.rounds,
                 names.SAMPLE_LAG: lambda: s.overruns}[spec]()
        return [(value, ())]

    def _source_health(self, spec: MetricSpec) -> Values:
        out = []
        for src in self._sampler.sources:
            h = self._sampler.health[src.name]
            value = {names.SOURCE_UP: float(h.up), names.SOURCE_DURATION: h.duration_s,
                     names.SOURCE_ERRORS: h.errors + getattr(src, "partial_errors", 0)}[spec]
            out.append((value, ((names.SOURCE, src.name),)))
        return out


class Instruments:
    """One observable OTel instrument per exported family (the OTLP path)."""

    def __init__(self, meter, exported: Exported, point_attrs: dict[str, str]):
        factories = {"gauge": meter.create_observable_gauge,
                     "counter": meter.create_observable_counter,
                     "updowncounter": meter.create_observable_up_down_counter}
        for spec, values in exported.families:
            factories[spec.kind](spec.name, callbacks=[self._callback(values, point_attrs)],
                                 unit=spec.unit, description=spec.description)

    @staticmethod
    def _callback(values: Callable[[], Values], point: dict[str, str]):
        def callback(options: CallbackOptions):
            return [Observation(v, {**point, **dict(key)}) for v, key in values()]
        return callback
