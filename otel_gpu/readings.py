"""The data model between sources and the agent: no OpenTelemetry import here.

A *source* reads one part of the machine (NVML, /sys, /proc, psutil) and returns
plain `Reading`s. The agent is the only place that turns them into OTel instruments.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping, NamedTuple, Protocol, runtime_checkable

from .prom_names import metric_name

Kind = Literal["gauge", "counter", "updowncounter", "histogram"]

# seconds between reads of values that change by an admin's action or slowly (power limit, ECC
# totals, swap, CPU count); sources repeat the last reading in between
SLOW_READ_S = 10.0


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its OTel name, unit (UCUM), instrument kind and meaning.

    `windowed` marks utilization-like gauges that are sampled faster than they are
    exported: the agent exports their mean over the export window plus `.min` and
    `.max` companions, so a stall shorter than the export interval stays visible.
    `companions=False` leaves them out where the mean says enough: a 0/1 flag (its mean
    is the share of the window it was 1), slow or secondary gauges, and rates whose exact
    byte counters are exported too.
    """

    name: str
    unit: str
    kind: Kind
    description: str
    attributes: tuple[str, ...] = ()
    source: str = ""
    hardware: str = "any"
    windowed: bool = False
    companions: bool = True
    buckets: tuple[float, ...] = ()

    def __hash__(self) -> int:
        return hash(self.name)   # names are unique; the generated hash walked every field each time

    def prometheus_name(self, *, unit_suffix: bool = True) -> str:
        """The name Prometheus 3 stores this metric under from OTLP (`hw.power` W -> `hw_power_watts`).

        See `otel_gpu.prom_names`. `unit_suffix=False` gives the form of OpenTelemetry's Python
        Prometheus exporter, which adds no `_ratio` to unit `1` gauges (for data exported
        through it elsewhere). Histograms add `_bucket/_sum/_count` on top of this.
        """
        return metric_name(self.name, self.unit, self.kind, ratio=unit_suffix)


class Reading(NamedTuple):
    """One observed value of `spec` with its attributes (all values strings).

    A named tuple: sources make hundreds a second, and it builds in a third of a
    frozen dataclass's time. Sources may share one attributes dict between readings
    and rounds (the store then files a reading by identity), so a dict handed out in
    a reading is never mutated afterwards.
    """

    spec: MetricSpec
    value: float
    attributes: Mapping[str, str] = MappingProxyType({})

    def to_json(self) -> dict:
        return {
            "name": self.spec.name,
            "unit": self.spec.unit,
            "value": self.value,
            "attributes": dict(self.attributes),
        }


new_reading = tuple.__new__
"""`new_reading(Reading, (spec, value, attributes))` is `Reading(spec, value, attributes)` without
the named tuple's Python-level `__new__` (~0.1 us less a reading, warm): for sources' per-round
loops, which build hundreds a second; all three fields must be given."""


class SourceError(Exception):
    """A source could not be read at all (one line, for humans: no traceback needed)."""


@runtime_checkable
class Source(Protocol):
    """Reads one part of the machine. `read()` returns what it could read.

    A source raises `SourceError` only when nothing could be read; partial failures
    (one GPU lost, one file unreadable) are left out of the result and added to its
    cumulative `partial_errors` count, which the agent exports as health data.
    """

    name: str
    partial_errors: int

    def read(self) -> list[Reading]: ...


def describe(source: object) -> dict:
    """What a source knows about its own capabilities (for `otel-gpu doctor`)."""
    fn = getattr(source, "describe", None)
    return fn() if callable(fn) else {}
