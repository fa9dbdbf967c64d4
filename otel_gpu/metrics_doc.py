"""Renders docs/metrics.md from otel_gpu.names (a test fails when the file drifts).

Regenerate: `python -m otel_gpu.metrics_doc > docs/metrics.md`
"""
from __future__ import annotations

import sys

from . import names
from .readings import MetricSpec

HEADER = """# Metrics reference

Generated from `otel_gpu/names.py` by `python -m otel_gpu.metrics_doc > docs/metrics.md`;
`tests/test_metrics_doc.py` fails when this file and the code disagree.

Names follow the OpenTelemetry semantic conventions where they exist (`hw.*`, `system.*`,
`process.*`); everything the conventions lack is under the one prefix `otelgpu.`.

**Prometheus form** is the name Prometheus 3's OTLP receiver stores (`translation_strategy:
UnderscoreEscapingWithSuffixes`, the rules of prometheus/otlptranslator, see
`otel_gpu/prom_names.py`; VictoriaMetrics with `-opentelemetry.usePrometheusNaming` and the
Collector's Prometheus exporters agree): unit suffix (`_bytes`, `_seconds`, `_watts`, `_joules`,
`_celsius`, `_hertz`, `_bytes_per_second`; none for units in braces), `_ratio` for unit `1`
gauges only (an updowncounter such as `hw.status` gets none), `_total` for counters,
`_bucket/_sum/_count` for histograms. The agent's own scrape endpoint (`--prometheus-port`) serves the very same
names, so dashboards and rules work on either path. Attribute keys become labels with dots
replaced by underscores (`hw.id` -> `hw_id`).

Every agent series also carries `host.name` and, when known, `otelgpu.job` (see
docs/agent.md), so series from the agent and from the training ranks join by node and job.

Derived, not exported: energy per training step and per token per GPU (J/step, J/token) is
`hw.energy`'s increase between its reads over `otelgpu.train.steps` and `otelgpu.train.tokens` of the
ranks whose processes the GPU lists (`otelgpu.gpu.process.memory.usage`), in the run report, the
Training dashboard and the tuner's evidence (docs/record.md, "Energy per step and per token").

**Windowed** gauges are sampled at the agent's interval (default 1 s, down to 100 ms) and
exported as the mean over the export window, with `otelgpu.<name>.min` and
`otelgpu.<name>.max` companions over the same window (listed below each), so a stall
shorter than the export interval still shows as a low minimum.

"""


def _row(spec: MetricSpec) -> str:
    forms = f"`{spec.prometheus_name()}`"
    attrs = ", ".join(f"`{a}`" for a in spec.attributes) or "-"
    kind = spec.kind + (" (windowed)" if spec.windowed else "")
    return (f"| `{spec.name}` | {forms} | {kind} | `{spec.unit}` | {attrs} | {spec.source} | "
            f"{spec.hardware} | {spec.description} |")


def render() -> str:
    lines = [HEADER.rstrip(), "",
             "| name | Prometheus form | kind | unit | attributes | source | where it exists | meaning |",
             "|---|---|---|---|---|---|---|---|"]
    for spec in names.all_specs():
        lines.append(_row(spec))
        if spec.windowed:
            lines += [_row(companion) for companion in names.windowed_companions(spec)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
