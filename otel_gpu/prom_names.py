"""OpenTelemetry metric names -> the names Prometheus 3 stores them under (pure functions).

The rules of Prometheus 3's OTLP receiver with `translation_strategy:
UnderscoreEscapingWithSuffixes` (prometheus/otlptranslator: `MetricNamer` with suffixes,
without UTF-8), which VictoriaMetrics' `-opentelemetry.usePrometheusNaming` and the
Collector's Prometheus exporters follow too:

- the name is split into tokens at every character outside `[a-zA-Z0-9:]` and joined with `_`;
- the unit adds a suffix unless the name already holds it as a token: `By` -> `bytes`,
  `By/s` -> `bytes_per_second`, units in braces (`{packet}`) add nothing, unknown units are
  kept as they are (cleaned);
- monotonic counters end in `_total`; **gauges** of unit `1` end in `_ratio`. An
  UpDownCounter (a non-monotonic sum) gets neither: `hw.status` -> `hw_status`;
- histograms get no suffix here (`_bucket`, `_sum`, `_count` come on top).
"""
from __future__ import annotations

import re

# otlptranslator's unitMap and perUnitMap
UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds",
    "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes", "TiBy": "tibibytes",
    "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams",
    "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent",
}
PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}

_SEPARATOR = re.compile(r"[^a-zA-Z0-9:]+")


def _clean(unit: str) -> str:
    """Unit text as name characters: invalid ones become `_`, runs of `_` one, no leading `_`."""
    return re.sub(r"__+", "_", re.sub(r"[^a-zA-Z0-9:]", "_", unit)).removeprefix("_")


def unit_suffixes(unit: str) -> tuple[str, str]:
    """(`bytes`, `per_second`) for `By/s`; empty strings where the unit adds nothing."""
    main_part, slash, per_part = unit.partition("/")
    main_part, per_part = main_part.strip(), per_part.strip()
    main = UNITS.get(main_part, main_part) if main_part and not set("{}") & set(main_part) else ""
    per = ""
    if slash and per_part and not set("{}") & set(per_part):
        per = "per_" + PER_UNITS.get(per_part, per_part)
    return _clean(main), _clean(per)


def metric_name(name: str, unit: str, kind: str, *, ratio: bool = True) -> str:
    """The Prometheus name of an OTel metric of `kind` (gauge, counter, updowncounter, histogram).

    `ratio=False` leaves `_ratio` off unit `1` gauges, the form OpenTelemetry's Python
    Prometheus exporter writes.
    """
    tokens = [t for t in _SEPARATOR.split(name) if t]
    main, per = unit_suffixes(unit)
    if main in tokens:
        main = ""
    per = "" if per == "per_" else per.removesuffix("_")
    if per in tokens:
        per = ""
    if per:
        main = main.removesuffix("_")
    tokens += [t for t in (main, per) if t]
    if kind == "counter":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if ratio and unit == "1" and kind == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    out = "_".join(tokens)
    return "_" + out if out[:1].isdigit() else out
