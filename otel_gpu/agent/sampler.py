"""The node agent: sources -> store -> exported families -> OTel instruments (OTLP) / scrape endpoint.

The only OTel-aware part of the agent. Sources are read at the sampling interval in one
thread; a source that hangs is left a thread of its own by a watchdog (see `Sampler`).
Export (the SDK's own thread, or a scrape) never blocks sampling.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

from .. import names
from ..readings import MetricSpec, Reading, Source, SourceError
from .store import Attrs, Store

log = logging.getLogger("otel_gpu.agent")


@dataclass
class SourceHealth:
    """Per-source health, exported as `otelgpu.agent.source.*`."""
    up: bool = False
    duration_s: float = 0.0
    errors: int = 0          # whole-source failures; partial ones come from the source
    last_error: str = ""


class _Lane:
    """Sources one thread reads in turn, and which of them it is reading since when."""

    def __init__(self, sources: list[Source]):
        self.sources = sources
        self.thread: threading.Thread | None = None
        self.busy: tuple[Source, float] | None = None   # (source, read started at, monotonic s)


@dataclass
class Sampler:
    """Reads every source each `interval_s` seconds into `store`, all in one thread.

    One thread, not one per source: each thread woken costs CPU every interval (a second
    thread made the agent ~10% dearer at 1 s). A source that hangs (NVML on a lost GPU,
    statvfs on a dead network filesystem) must not stop the others, so a watchdog looks
    every `stuck_after_s`: a read running longer than that keeps its thread to itself and
    the other sources move to a fresh one, having missed at most two watchdog periods.
    """
    sources: Sequence[Source]
    store: Store
    interval_s: float
    clock: Callable[[], float] = time.monotonic
    stuck_after_s: float = 5.0
    health: dict[str, SourceHealth] = field(default_factory=dict)
    rounds: int = 0
    overruns: int = 0

    def __post_init__(self):
        self._stopping = False
        self._asleep = threading.Lock()   # held while running; stop() releases it to wake every loop
        self._asleep.acquire()
        self._threads: list[threading.Thread] = []
        self._lanes: list[_Lane] = []
        self._lock = threading.Lock()
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

    def _loop(self, lane: _Lane) -> None:
        next_t = self.clock()
        while not self._stopping:
            read = 0
            for source in tuple(lane.sources):
                if source not in lane.sources:
                    continue   # the watchdog gave it a thread of its own while we were stuck
                lane.busy = (source, self.clock())
                self.read_once(source)
                read += 1
            lane.busy = None
            next_t += self.interval_s
            now = self.clock()
            with self._lock:
                self.rounds += read   # one round per source read
                if now > next_t:
                    self.overruns += 1
            if now > next_t:  # fell behind: skip missed ticks rather than bursting
                next_t = now
            self._sleep(next_t - now)

    def _sleep(self, seconds: float) -> None:
        """Until `seconds` passed or stop(): a bare lock's timed acquire costs half of
        Event.wait's CPU per wake-up."""
        if self._asleep.acquire(timeout=max(0.0, seconds)):
            self._asleep.release()   # stop() released it: let the other threads wake too

    def _spawn(self, sources: list[Source]) -> None:
        lane = _Lane(sources)
        lane.thread = threading.Thread(target=self._loop, args=(lane,), name="otelgpu-sampler", daemon=True)
        self._lanes.append(lane)
        self._threads.append(lane.thread)
        lane.thread.start()

    def _watch(self) -> None:
        while True:
            self._sleep(self.stuck_after_s)
            if self._stopping:
                return
            now = self.clock()
            with self._lock:
                for lane in list(self._lanes):
                    busy = lane.busy
                    if busy is None or len(lane.sources) < 2 or now - busy[1] < self.stuck_after_s:
                        continue
                    stuck = busy[0]
                    rest = [s for s in lane.sources if s is not stuck]
                    lane.sources = [stuck]
                    lane.thread.name = f"otelgpu-{stuck.name}"
                    log.warning("source %s: read running for %.0f s; the other sources go on in another thread",
                                stuck.name, now - busy[1])
                    self._spawn(rest)

    def start(self) -> None:
        with self._lock:
            self._spawn(list(self.sources))
        watchdog = threading.Thread(target=self._watch, name="otelgpu-watchdog", daemon=True)
        watchdog.start()
        self._threads.append(watchdog)

    def stop(self, timeout_s: float = 2.0) -> None:
        if not self._stopping:
            self._stopping = True
            self._asleep.release()
        deadline = time.monotonic() + timeout_s
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))


Values = tuple[Sequence[float], Sequence[Attrs]]   # (values, series keys): two columns, same order
_NONE: Values = ((), ())


class Exported:
    """Every series family the agent exports, as (spec, values) pairs read at export time.

    Shared by the OTel instruments (OTLP) and the Prometheus exposition, so both paths
    export the same families with the same values.
    """

    def __init__(self, sampler: Sampler, export_failures: Callable[[], int] = lambda: 0,
                 scrape_refused: Callable[[], int] = lambda: 0):
        self._sampler = sampler
        self._store = sampler.store
        self._export_failures = export_failures
        self._scrape_refused = scrape_refused
        # one key object per source, kept: each scrape finds the same series keys (no template rebuild)
        self._source_keys = tuple(((names.SOURCE, src.name),) for src in sampler.sources)
        health = {names.SOURCE_UP: self._source_health, names.SOURCE_DURATION: self._source_health,
                  names.SOURCE_ERRORS: self._source_health, names.EXPORT_FAILURES: self._agent_health,
                  names.SCRAPE_REFUSED: self._agent_health,
                  names.SAMPLES: self._agent_health, names.SAMPLE_LAG: self._agent_health}
        self.families: list[tuple[MetricSpec, Callable[[], Values]]] = []
        for spec in names.all_specs():
            if spec.kind == "histogram" or spec.name.startswith(names.PREFIX + "train."):
                continue  # recorded by the training hooks, not observed here
            if spec in health:
                self.families.append((spec, partial(health[spec], spec)))
            elif spec.windowed:  # the gauge is the mean over the window, with min / max companions
                self.families.append((spec, partial(self._window, spec, 0)))
                for index, companion in enumerate(names.windowed_companions(spec), start=1):   # min, max
                    self.families.append((companion, partial(self._window, spec, index)))
            else:
                self.families.append((spec, partial(self._latest, spec)))

    def _latest(self, spec: MetricSpec) -> Values:
        return self._store.columns(self._sampler.clock()).get(spec.name, _NONE)

    def _window(self, spec: MetricSpec, index: int) -> Values:
        columns = self._store.columns(self._sampler.clock()).get(spec.name)
        return _NONE if columns is None else (columns[index], columns[3])

    def _agent_health(self, spec: MetricSpec) -> Values:
        s = self._sampler
        if spec.name == names.EXPORT_FAILURES.name:
            value = self._export_failures()
        elif spec.name == names.SCRAPE_REFUSED.name:
            value = self._scrape_refused()
        else:
            value = s.rounds if spec.name == names.SAMPLES.name else s.overruns
        return [value], ((),)

    def _source_health(self, spec: MetricSpec) -> Values:
        health = self._sampler.health
        if spec.name == names.SOURCE_UP.name:
            values = [float(health[src.name].up) for src in self._sampler.sources]
        elif spec.name == names.SOURCE_DURATION.name:
            values = [health[src.name].duration_s for src in self._sampler.sources]
        else:
            values = [health[src.name].errors + getattr(src, "partial_errors", 0) for src in self._sampler.sources]
            reasons = [(src.name, why, n) for src in self._sampler.sources
                       for why, n in sorted(getattr(src, "error_reasons", {}).items())]
            if reasons:   # errors a source counts by reason: a series each, with error.type
                return values + [n for _, _, n in reasons], self._reason_keys(tuple(r[:2] for r in reasons))
        return values, self._source_keys

    def _reason_keys(self, reasons: tuple[tuple[str, str], ...]) -> tuple:
        """The source keys plus one (source, error.type) key per reason, built once per set of reasons."""
        cached = getattr(self, "_reasons_cached", None)
        if cached is None or cached[0] != reasons:
            keys = self._source_keys + tuple(((names.SOURCE, src), (names.ERROR_TYPE, why)) for src, why in reasons)
            cached = self._reasons_cached = (reasons, keys)
        return cached[1]


class Instruments:
    """One observable OTel instrument per exported family (the OTLP path)."""

    def __init__(self, meter, exported: Exported, point_attrs: dict[str, str]):
        from opentelemetry.metrics import Observation   # the OTLP path only: a scrape-only agent never loads it

        self._observation = Observation
        factories = {"gauge": meter.create_observable_gauge,
                     "counter": meter.create_observable_counter,
                     "updowncounter": meter.create_observable_up_down_counter}
        for spec, values in exported.families:
            factories[spec.kind](spec.name, callbacks=[self._callback(values, point_attrs)],
                                 unit=spec.unit, description=spec.description)

    def _callback(self, values: Callable[[], Values], point: dict[str, str]):
        observation = self._observation

        def callback(options):   # options: opentelemetry.metrics.CallbackOptions
            return [observation(v, {**point, **dict(key)}) for v, key in zip(*values())]
        return callback
