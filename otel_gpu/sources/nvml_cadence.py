"""When each NVML field is read: measured call costs decide it.

Most NVML calls cost about a microsecond, but a few cost milliseconds: on an H100 the energy
counter takes ~4 ms of CPU a call (the field-value API with the energy field the same) and a
PCIe throughput sample ~21 ms, 20 of them asleep inside the driver. Each field's first calls
on a device are timed (wall and CPU); a field whose calls cost more than `COSTLY_CPU_S` of CPU
or `COSTLY_WALL_S` of wall time is *costly*. Costly fields are read on a background thread
(`BackgroundLane`), never in the sampling round, each at most every `floor_s` seconds, and all
of them together are kept under `BUDGET_CPU` of one core by stretching those periods alike
(`stretch`). Between two reads a costly field's last readings are repeated.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

log = logging.getLogger("otel_gpu.sources.nvml")

COSTLY_CPU_S = 0.5e-3    # s of CPU per call above which a field is costly
COSTLY_WALL_S = 2e-3     # s of wall time per call above which a field is costly (it sleeps in the driver)
BUDGET_CPU = 0.5e-3      # share of one core all costly reads may use together (0.5 ms of CPU a second)
TIMED_CALLS = 3          # calls timed per field and device before its cost counts as known


@dataclass
class CallCost:
    """Wall and CPU seconds of the timed calls of one field on one device: the first call apart (it carries
    NVML's one-time set-up of the function), the median of the last few after it as the cost of a call."""

    call: str
    walls: list[float] = field(default_factory=list)   # s, calls after the first
    cpus: list[float] = field(default_factory=list)
    first_wall_s: float | None = None
    first_cpu_s: float | None = None
    again: tuple | None = None   # (function, args) of the last timed call: doctor times a getter again

    def add(self, wall_s: float, cpu_s: float) -> None:
        if self.first_wall_s is None:
            self.first_wall_s, self.first_cpu_s = wall_s, cpu_s
            return
        self.walls.append(wall_s)
        self.cpus.append(cpu_s)
        if len(self.walls) > 2 * TIMED_CALLS:
            del self.walls[0], self.cpus[0]

    @property
    def known(self) -> bool:
        return (self.first_wall_s is not None) + len(self.walls) >= TIMED_CALLS

    @property
    def steady(self) -> bool:
        """A call after the first was timed: `wall_s` and `cpu_s` are per-call costs, set-up left out."""
        return bool(self.walls)

    @property
    def wall_s(self) -> float:
        return median(self.walls) if self.walls else self.first_wall_s or 0.0

    @property
    def cpu_s(self) -> float:
        return median(self.cpus) if self.cpus else self.first_cpu_s or 0.0

    @property
    def costly(self) -> bool:
        return is_costly(self.wall_s, self.cpu_s)


def median(values: Iterable[float]) -> float:
    """The median of a non-empty series (as `statistics.median`, whose import brings `decimal` and
    `fractions` into the node agent)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def is_costly(wall_s: float, cpu_s: float) -> bool:
    """True when one call costs more than COSTLY_WALL_S of wall time or COSTLY_CPU_S of CPU."""
    return wall_s > COSTLY_WALL_S or cpu_s > COSTLY_CPU_S


def timed(costs: dict[str, CallCost], key: str, call: str, fn: Callable, *args):
    """`fn(*args)`, its wall and CPU time added to `costs[key]` (also when it raises)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        return fn(*args)
    finally:
        cost = costs.get(key)
        if cost is None:
            cost = costs[key] = CallCost(call)
        cost.add(time.perf_counter() - t0, time.thread_time() - c0)
        cost.again = (fn, args)


def stretch(cpu_per_s_at_floor: float, budget: float = BUDGET_CPU) -> float:
    """The factor (>= 1) every costly field's period is multiplied by so that, read at
    `floor x factor`, they use at most `budget` of one core; `cpu_per_s_at_floor` is what they
    would use at their floors (CPU s per s)."""
    if not cpu_per_s_at_floor > budget:
        return 1.0
    return cpu_per_s_at_floor / budget


@dataclass
class SlowField:
    """A costly field of one device: read every `period_s` (>= `floor_s`), readings kept between reads.

    `read_at` is the source clock (s) when the last completed read called NVML; `readings` is
    replaced whole by each read (never mutated), so the sampling thread can hand it on as is.
    """

    name: str
    floor_s: float
    period_s: float = 0.0
    readings: list = field(default_factory=list)
    read_at: float | None = None
    submitted_at: float | None = None
    pending: bool = False
    cpu_s: float = 0.0    # CPU of one read (all its calls), measured

    def __post_init__(self):
        self.period_s = self.period_s or self.floor_s

    def due(self, now: float) -> bool:
        return not self.pending and (self.submitted_at is None or now - self.submitted_at >= self.period_s)


class BackgroundLane:
    """One daemon thread running submitted jobs in turn (the costly NVML reads), started on first use.

    A job that raises is logged and counted in `errors`; the lane goes on with the next job.
    """

    def __init__(self, name: str = "otelgpu-nvml-slow"):
        self.name = name
        self.errors = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        if self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:   # a bug in one read must not end the lane: counted and logged
                self.errors += 1
                log.warning("background NVML read failed: %s: %s", type(exc).__name__, exc)

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop after the job in progress (waiting at most `timeout_s`: a hung call is left behind)."""
        self._closed = True
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout_s)
