"""One rank's telemetry session: the timer, its OTel instruments, the profiler.

The process-wide session is created at the first hook call (so a launcher such as
torchrun, which never trains, exports nothing), exports over OTLP as configured by the
standard `OTEL_*` variables with the node agent's resource identity, and is shut down
at exit with a short timeout so a dead backend never holds the process.
"""
from __future__ import annotations

import atexit
from collections import deque
import logging
import os
import socket
import sys
import threading
import time
import weakref
from typing import Mapping

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricReader

from .. import names, profiling
from ..errors import ConfigError
from ..export import (import_exporter, merged_resource, meter_provider, otlp_exporter, otlp_settings,
                      periodic_reader)
from ..identity import point_attributes, rank_info, resource_attributes
from ..values import SWITCH_OFF
from . import dtype, flops, flops_measure
from .allocator import AllocatorReader
from .gc_clock import GcClock
from .timing import Timer

log = logging.getLogger("otel_gpu.training")

TRAINING_SPECS = (names.TRAIN_STEP_DURATION, names.TRAIN_STEPS, names.TRAIN_SAMPLES, names.TRAIN_TOKENS,
                  names.TRAIN_PHASE_TIME, names.TRAIN_CHECKPOINTS, names.TRAIN_COLLECTIVE_TIME,
                  names.TRAIN_CHECKPOINT_LAST, names.TRAIN_COLLECTIVE_COUNT, names.TRAIN_COLLECTIVE_UNMEASURED,
                  names.TRAIN_STEP_LAST, names.TRAIN_COLLECTIVE_OPEN, names.TRAIN_COLLECTIVE_SEQ, names.TRAIN_FLOPS,
                  names.TRAIN_COMPUTE_DTYPE)
HEALTH_SPECS = (names.TRAIN_GC_TIME, names.TRAIN_GC_COLLECTIONS, names.TRAIN_ALLOC_RESERVED, names.TRAIN_ALLOC_ALLOCATED,
                names.TRAIN_ALLOC_INACTIVE_SPLIT, names.TRAIN_ALLOC_RETRIES, names.TRAIN_ALLOC_OOMS)
TRAINING_SPECS += HEALTH_SPECS
names.register(*TRAINING_SPECS)
EXIT_TIMEOUT_S = 5.0   # longest the final flush (metrics and profile at once) may hold the exit of a rank


def rank_attributes(env: Mapping[str, str], resource: Mapping[str, str]) -> dict[str, str]:
    """Point attributes of one rank: node and job (as the node agent puts them on its points),
    rank, local rank, world size (0, 0, 1 when the launcher set none)."""
    attrs = point_attributes(resource)
    attrs.update({names.RANK: "0", names.LOCAL_RANK: "0", names.WORLD_SIZE: "1"})
    attrs.update(rank_info(env))
    return attrs


class _OncePerMinute(logging.Filter):
    """Lets one record through per minute: a dead backend is said, not repeated every export."""

    def __init__(self, period_s: float = 60.0):
        super().__init__()
        self.period_s, self._last = period_s, -period_s

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self._last >= self.period_s:
            self._last = now
            return True
        return False


def quiet_exporter_logs() -> None:
    for name in ("opentelemetry.exporter.otlp.proto.http.metric_exporter",
                 "opentelemetry.exporter.otlp.proto.grpc.exporter",
                 "opentelemetry.sdk.metrics._internal.export"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OncePerMinute) for f in logger.filters):
            logger.addFilter(_OncePerMinute())


class OtelSink:
    """Timer measurements -> OTel instruments, off the training thread's path.

    The hot path only adds to plain numbers (about 1 us per call); observable
    counters read the totals when the exporter collects, and the step durations
    queued since the last collection are recorded into the histogram there.
    """

    def __init__(self, meter, attrs: Mapping[str, str], gc_clock: GcClock | None = None,
                 allocator: AllocatorReader | None = None):
        self.attrs = dict(attrs)
        self.gc_clock = gc_clock                # time in Python's garbage collector, when given
        self.allocator = allocator              # the CUDA caching allocator's counters, when given
        self._alloc_cache: tuple[float, dict] = (-1.0, {})   # (monotonic s, device -> stats) of the latest read
        self.steps = 0
        self.samples = 0.0
        self.tokens = 0.0                      # given by the program (step(tokens=...)); wins when set
        self.tokens_counted = 0.0              # non-padding tokens of the training batches fetched
        self.token_positions = 0.0             # sum of tokens x sequence length (the attention term's basis)
        self.model = None                      # weakref to the model trained (the largest seen), for its FLOPs
        self._model_size = -1
        self._shape = None                     # flops.Shape of that model, read when it is seen
        self.flops_meter = flops_measure.Meter() if flops_measure.requested() else None   # OTELGPU_FLOPS=measure
        self.compute_dtype = ""                # what that model computes in (dtype.py), seen in its first forward
        self.phase_s: dict[str, float] = {}
        self.checkpoints = {"start": 0, "end": 0}
        self.checkpoint_last: dict[str, float] = {}            # event -> unix time of the latest
        self.collective_s: dict[tuple[str, str, str, str], float] = {}   # (kind, phase, basis, group) -> seconds
        self.collective_n: dict[tuple[str, str], int] = {}     # GPU-timed: (kind, group) -> collectives
        self.unmeasured_n: dict[str, int] = {}                 # reason -> collectives not measured
        self.first_step_ns: int | None = None   # unix ns when the first counted step began
        self.step_last: float | None = None      # unix s when the latest counted step ended
        self.live_phases = None   # () -> {phase: seconds incl. open phases} (Timer.phase_totals), when set
        self.open_waits = None    # () -> {kind: seconds inside a host wait still open} (Timer.open_waits), when set
        self.open_kinds: set[str] = set()        # host-timed kinds seen: exported as 0 while no wait of theirs is open
        self.collective_seqs: dict[tuple[str, str], int] = {}   # (process group, state) -> last sequence number
        self._pending: deque[float] = deque()   # step durations not yet in the histogram
        self._duration = meter.create_histogram(names.TRAIN_STEP_DURATION.name, unit="s",
                                                description=names.TRAIN_STEP_DURATION.description)
        spec = names.TRAIN_STEPS
        meter.create_observable_counter(spec.name, [self._observe_steps], unit="{step}", description=spec.description)
        for spec, unit, fn in ((names.TRAIN_SAMPLES, "{sample}", self._observe_samples),
                               (names.TRAIN_TOKENS, "{token}", self._observe_tokens),
                               (names.TRAIN_FLOPS, "{flop}", self._observe_flops),
                               (names.TRAIN_PHASE_TIME, "s", self._observe_phases),
                               (names.TRAIN_CHECKPOINTS, "{event}", self._observe_checkpoints),
                               (names.TRAIN_COLLECTIVE_TIME, "s", self._observe_collectives),
                               (names.TRAIN_COLLECTIVE_COUNT, "{collective}", self._observe_collective_counts),
                               (names.TRAIN_COLLECTIVE_UNMEASURED, "{collective}", self._observe_unmeasured)):
            meter.create_observable_counter(spec.name, [fn], unit=unit, description=spec.description)
        for spec, unit, fn in ((names.TRAIN_CHECKPOINT_LAST, "s", self._observe_checkpoint_last),
                               (names.TRAIN_STEP_LAST, "s", self._observe_step_last),
                               (names.TRAIN_COLLECTIVE_OPEN, "s", self._observe_open),
                               (names.TRAIN_COLLECTIVE_SEQ, "{collective}", self._observe_seqs),
                               (names.TRAIN_COMPUTE_DTYPE, "{dtype}", self._observe_dtype)):
            meter.create_observable_gauge(spec.name, [fn], unit=unit, description=spec.description)
        for spec, unit, fn in ((names.TRAIN_GC_TIME, "s", self._observe_gc_time),
                               (names.TRAIN_GC_COLLECTIONS, "{collection}", self._observe_gc_count),
                               (names.TRAIN_ALLOC_RETRIES, "{retry}", self._alloc_observer("retries")),
                               (names.TRAIN_ALLOC_OOMS, "{oom}", self._alloc_observer("ooms"))):
            meter.create_observable_counter(spec.name, [fn], unit=unit, description=spec.description)
        for spec, field in ((names.TRAIN_ALLOC_RESERVED, "reserved"), (names.TRAIN_ALLOC_ALLOCATED, "allocated"),
                            (names.TRAIN_ALLOC_INACTIVE_SPLIT, "inactive_split")):
            meter.create_observable_gauge(spec.name, [self._alloc_observer(field)], unit="By",
                                          description=spec.description)

    # ---- hot path (training thread) ----
    def step(self, seconds, samples, tokens):
        if self.first_step_ns is None:
            self.first_step_ns = time.time_ns() - int(seconds * 1e9)
            if self.gc_clock is not None:   # set-up's collections (model build, data indexing) are not the steps'
                self.gc_clock.restart()
        self._pending.append(seconds)
        self.steps += 1
        self.step_last = time.time()
        if samples:
            self.samples += samples
        if tokens:
            self.tokens += tokens

    def fetched(self, tokens, seq):
        """A training batch of `tokens` non-padding tokens in sequences of `seq` positions was fetched."""
        self.tokens_counted += tokens
        self.token_positions += tokens * seq

    def model_seen(self, model):
        """`model` is trained here (an integration's model, a plain loop's outermost module): the one
        with the most parameters is the one whose FLOPs are counted. Once per model, not per step."""
        size = sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in model.parameters())
        if size > self._model_size:
            self.model, self._model_size, self._shape = weakref.ref(model), size, self._shape_of(model)
            dtype.watch(model, self._dtype_seen)

    def _dtype_seen(self, name):
        self.compute_dtype = name

    def phase(self, name, seconds):
        self.phase_s[name] = self.phase_s.get(name, 0.0) + seconds

    def checkpoint(self, event):
        self.checkpoints[event] += 1
        self.checkpoint_last[event] = time.time()

    def collective(self, kind, phase, seconds):
        key = (kind, phase, "host", "")
        self.collective_s[key] = self.collective_s.get(key, 0.0) + seconds

    # ---- GPU-timed collectives (the Flight Recorder poller's thread) ----
    def collective_gpu(self, kind, group, seconds, count):
        key = (kind, "", "gpu", group)
        self.collective_s[key] = self.collective_s.get(key, 0.0) + seconds
        self.collective_n[(kind, group)] = self.collective_n.get((kind, group), 0) + count

    def unmeasured(self, reason, count):
        self.unmeasured_n[reason] = self.unmeasured_n.get(reason, 0) + count

    def collective_seq(self, group, state, seq):
        self.collective_seqs[(group, state)] = seq

    # ---- collection (exporter thread) ----
    def _observe_steps(self, options):
        pending = self._pending
        while pending:   # deque append/popleft are thread-safe: no step is lost or counted twice
            self._duration.record(pending.popleft(), self.attrs)
        # the series starts with the first step: a session opened early (a collective during set-up)
        # must not stretch the rank's wall time back to its set-up
        return [Observation(self.steps, self.attrs)] if self.steps else []

    def _observe_samples(self, options):
        return [Observation(self.samples, self.attrs)] if self.samples else []

    def _observe_tokens(self, options):
        tokens = self.tokens or self.tokens_counted
        return [Observation(tokens, self.attrs)] if tokens else []

    def _shape_of(self, model):
        """flops.Shape of `model`, read when it is seen (a loop's model may be gone by the last export,
        at exit); None after an error. About as costly as the size above, once per model."""
        try:
            shape = flops.model_shape(model)
        except Exception as exc:  # never let our bug reach the training loop
            log.warning("otel-gpu: model FLOPs not counted: %r", exc)
            return None
        if shape.why_not and self.flops_meter is None:
            log.info("otel-gpu: model FLOPs not checked: %s (%s=measure measures one batch)", shape.why_not,
                     flops_measure.SETTING)
        return shape

    def _observe_flops(self, options):
        measured = self.flops_meter.flops() if self.flops_meter is not None else None
        if measured is not None:   # one training batch under FlopCounterMode (flops_measure.py)
            return [Observation(measured, {**self.attrs, names.FLOPS_BASIS: flops.BASIS_MEASURED})] if measured else []
        shape, tokens = self._shape, self.tokens_counted
        if shape is None or shape.why_not or not tokens:
            return []
        value = flops.model_flops(shape, tokens, self.token_positions)
        return [Observation(value, {**self.attrs, names.FLOPS_BASIS: flops.BASIS_ATTENTION})]

    def _observe_phases(self, options):
        # with the timer's live totals, a phase still open counts up to now: a long save is spread
        # over the exports it spans instead of landing in the first export after its end
        totals = self.live_phases() if self.live_phases is not None else dict(self.phase_s)
        return [Observation(v, {**self.attrs, names.PHASE: k}) for k, v in totals.items()]

    def _observe_checkpoints(self, options):
        if not self.checkpoints["start"]:
            return []
        return [Observation(v, {**self.attrs, names.CHECKPOINT_EVENT: k}) for k, v in self.checkpoints.items()]

    def _observe_checkpoint_last(self, options):
        return [Observation(v, {**self.attrs, names.CHECKPOINT_EVENT: k}) for k, v in list(self.checkpoint_last.items())]

    def _observe_dtype(self, options):
        d = self.compute_dtype
        return [Observation(1, {**self.attrs, names.DTYPE: d})] if d else []

    def _observe_step_last(self, options):
        t = self.step_last
        return [Observation(t, self.attrs)] if t is not None else []

    def _observe_open(self, options):
        # computed here (the hot path stores a start time only): every host-timed kind seen so far, 0 when
        # no wait of it is open, so "not inside" is a value and not a missing series
        now = self.open_waits() if self.open_waits is not None else {}
        kinds = self.open_kinds
        kinds.update(now)
        kinds.update(kind for kind, _, basis, _ in list(self.collective_s) if basis == "host")
        return [Observation(now.get(k, 0.0), {**self.attrs, names.COLLECTIVE: k}) for k in sorted(kinds)]

    def _observe_seqs(self, options):
        return [Observation(v, {**self.attrs, names.PROCESS_GROUP: group, names.COLLECTIVE_STATE: state})
                for (group, state), v in list(self.collective_seqs.items())]

    def _observe_collectives(self, options):
        return [Observation(v, {**self.attrs, names.COLLECTIVE: kind, names.PHASE: phase,
                                names.COLLECTIVE_BASIS: basis, names.PROCESS_GROUP: group})
                for (kind, phase, basis, group), v in list(self.collective_s.items())]

    def _observe_collective_counts(self, options):
        return [Observation(v, {**self.attrs, names.COLLECTIVE: kind, names.COLLECTIVE_BASIS: "gpu",
                                names.PROCESS_GROUP: group}) for (kind, group), v in list(self.collective_n.items())]

    def _observe_gc_time(self, options):
        if self.gc_clock is None or not self.steps:   # from the first step, as the step counter
            return []
        return [Observation(v, {**self.attrs, names.GC_GENERATION: g}) for g, v in self.gc_clock.seconds().items()]

    def _observe_gc_count(self, options):
        if self.gc_clock is None or not self.steps:
            return []
        return [Observation(v, {**self.attrs, names.GC_GENERATION: g}) for g, v in self.gc_clock.collections().items()]

    def _allocator_stats(self) -> dict:
        """Device -> AllocatorStats, read once per collection (the five instruments share one read)."""
        if self.allocator is None:
            return {}
        now = time.monotonic()
        at, stats = self._alloc_cache
        if now - at > 0.5:
            stats = self.allocator.read()
            self._alloc_cache = (now, stats)
        return stats

    def _alloc_observer(self, field: str):
        def observe(options):
            out = []
            for device, st in self._allocator_stats().items():
                v = getattr(st, field)
                if v is not None:
                    out.append(Observation(v, {**self.attrs, names.CUDA_DEVICE: device}))
            return out
        return observe

    def _observe_unmeasured(self, options):
        return [Observation(v, {**self.attrs, names.UNMEASURED_REASON: reason})
                for reason, v in list(self.unmeasured_n.items())]


class ForkGuard(MetricExporter):
    """Drops exports made in a forked child (DataLoader workers inherit the parent's reader)."""

    def __init__(self, inner: MetricExporter):
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner = inner
        self.pid = os.getpid()

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        if os.getpid() != self.pid:
            return MetricExportResult.SUCCESS
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return os.getpid() != self.pid or self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        if os.getpid() == self.pid:
            self.inner.shutdown(timeout_millis=timeout_millis)


class Session:
    """Timer + MeterProvider + optional Profiler for this process."""

    def __init__(self, env: Mapping[str, str], readers: list[MetricReader] | None = None,
                 profile: bool = True, host: str | None = None):
        host = host or socket.gethostname()
        # the node agent's identity (OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME on top), so the two join
        resource = merged_resource({**resource_attributes(env, host=host), "service.name": "otel-gpu-training"})
        self.attrs = rank_attributes(env, resource.attributes)
        self.exporter = None
        if readers is None:
            readers = []
            settings = otlp_settings(env, default_interval_s=10.0)
            if settings.endpoint:
                quiet_exporter_logs()
                self.exporter = otlp_exporter(settings)
                readers.append(periodic_reader(ForkGuard(self.exporter), settings))
        self.provider = meter_provider(resource, readers, TRAINING_SPECS)
        self.gc_clock = GcClock()
        self.gc_clock.install()
        self.sink = OtelSink(self.provider.get_meter("otel_gpu.training"), self.attrs, self.gc_clock, AllocatorReader())
        self.timer = Timer(self.sink)
        self.sink.live_phases = self.timer.phase_totals
        self.sink.open_waits = self.timer.open_waits
        self.profiler = None
        if profile:
            app = profiling.service_name(env, self.attrs.get(names.JOB))
            self.profiler = profiling.start(profiling.profile_settings(env, app, profiling.pyroscope_tags(self.attrs)))
        self.timer.listener = self.profiler
        self._closed = False

    def shutdown(self, timeout_s: float = EXIT_TIMEOUT_S) -> None:
        """Close the profiler and flush metrics side by side, bounded by `timeout_s` in all."""
        if self._closed:
            return
        self._closed = True
        self.gc_clock.uninstall()
        if "otel_gpu.training.gpu_collectives" in sys.modules:   # the last GPU-timed collectives first
            sys.modules["otel_gpu.training.gpu_collectives"].stop()
        stopper = None
        if self.profiler is not None:
            stopper = threading.Thread(target=self.profiler.shutdown, args=(min(2.0, timeout_s),),
                                       name="otelgpu-profiler-stop", daemon=True)
            stopper.start()
        self.provider.shutdown(timeout_millis=timeout_s * 1000)
        if stopper is not None:
            stopper.join(min(2.0, timeout_s))


_lock = threading.Lock()
_session: Session | None = None
# run once when the session starts: the torch hooks (data wait, backward, collective wait), which the
# package registers (otel_gpu/training/__init__.py) so that they import this module and never the reverse
ON_START: list = []
_pending_model = None   # weakref to a model found before the session started
_forked = False      # this process is a fork of one that had a session: no profiler here
_disabled = False


def current(env: Mapping[str, str] | None = None) -> Session | None:
    """The process's session, created on first use; None when turned off (`OTELGPU_TRAINING=0`)."""
    global _session, _disabled
    if _session is not None or _disabled:
        return _session
    with _lock:
        if _session is not None or _disabled:
            return _session
        env = os.environ if env is None else env
        if env.get("OTELGPU_TRAINING", "1").strip().lower() in SWITCH_OFF:
            _disabled = True
            return None
        try:
            _session = Session(env, profile=not _forked)
        except ConfigError as exc:
            _disabled = True
            log.warning("otel-gpu training telemetry off: %s", exc)
            return None
        except Exception as exc:  # telemetry that cannot start must not stop the training
            _disabled = True
            log.warning("otel-gpu training telemetry off: %r", exc)
            return None
        atexit.register(_shutdown_at_exit)
        pending = _pending_model() if _pending_model is not None else None
        if pending is not None:
            model_seen(pending)
        if env.get("OTELGPU_STACKS_DIR", "").strip():   # set by `otel-gpu run --record`: stacks on a signal
            _stacks_on_request(env, _session.attrs.get(names.RANK, "0"))
        if env.get("OTELGPU_TRACE_STEPS", "").strip() or env.get("OTELGPU_TRACE_DIR", "").strip():
            _trace_capture(env, _session)   # profiler traces of chosen steps (`otel-gpu run --trace-steps`)
        for start in ON_START:
            try:
                start()
            except Exception as exc:  # an unknown torch version: the step metrics still work
                log.warning("otel-gpu: data and collective wait not measured: %r", exc)
        return _session


def _stacks_on_request(env: Mapping[str, str], rank: str) -> None:
    try:
        from .. import stacks
        stacks.install(env, rank)
    except Exception as exc:  # a stack dump we cannot offer must not stop the training
        log.warning("otel-gpu: stacks on request off: %r", exc)


def _trace_capture(env: Mapping[str, str], s: Session) -> None:
    try:
        from . import trace_capture
        trace_capture.install(env, s.attrs.get(names.RANK, "0"), s.timer)
    except Exception as exc:  # a capture we cannot offer must not stop the training
        log.warning("otel-gpu: no trace capture: %r", exc)


def prepare(env: Mapping[str, str] | None = None) -> None:
    """Import now what the session loads when it starts (the OTLP exporter and its HTTP stack,
    pyroscope-io), so a rank's first batch or step does not pay for it; starts nothing, exports
    nothing (launchers stay silent). Called when torch is imported under `otel-gpu run`."""
    env = os.environ if env is None else env
    if env.get("OTELGPU_TRAINING", "1").strip().lower() in SWITCH_OFF:
        return
    try:
        settings = otlp_settings(env, default_interval_s=10.0)
        if settings.endpoint:
            import_exporter(settings.protocol)
        profile_off = env.get("OTELGPU_PROFILE", "1").strip().lower() in SWITCH_OFF
        if env.get("OTELGPU_PYROSCOPE_URL", "").strip() and not profile_off and not _forked:
            import pyroscope  # noqa: F401
    except ConfigError:
        return   # said once, when the session starts
    except ImportError as exc:
        log.debug("otel-gpu: not imported ahead: %r", exc)


def model_seen(model) -> None:
    """An integration found the model being trained (for its FLOPs); never raises."""
    global _pending_model
    if model is None:
        return
    seen = getattr(getattr(_session, "sink", None), "model_seen", None)
    try:
        if seen is None:   # before the session starts (a Trainer being built): kept for it
            _pending_model = weakref.ref(model)
            return
        seen(model)
    except Exception as exc:  # never let our bug reach the training loop
        log.warning("otel-gpu: model FLOPs not counted: %r", exc)


def timer() -> Timer | None:
    s = current()
    return s.timer if s is not None else None


def _shutdown_at_exit() -> None:
    s = _session
    if s is not None and os.getpid() == _pid_of_session:
        s.shutdown()


_pid_of_session = os.getpid()


def _after_fork_in_child() -> None:
    global _session, _forked, _pid_of_session
    if _session is not None:
        _forked = True
        _session.gc_clock.uninstall()   # a forked worker's collections are not the rank's
    _session = None
    _pid_of_session = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
