"""Panel, target and variable builders shared by the dashboards in `grafana/dashboards/`.

grafanalib 0.7.1 gives the panel classes; this module adds what it lacks (a flame graph
panel and a Pyroscope target, a Prometheus target without the legacy fields) and the
house rules every panel follows: a fixed datasource UID, a unit, a one-line description
of what to look for, thresholds where a value is good or bad.
"""
from __future__ import annotations

import re

import attr
from grafanalib import core as g

PROMETHEUS_UID = "otelgpu-prometheus"
PYROSCOPE_UID = "otelgpu-pyroscope"
PROMETHEUS = {"type": "prometheus", "uid": PROMETHEUS_UID}
PYROSCOPE = {"type": "grafana-pyroscope-datasource", "uid": PYROSCOPE_UID}
GRAFANA = {"type": "grafana", "uid": "-- Grafana --"}     # Grafana's built-in datasource

# What pyroscope-io 1.4 pushes from a Python rank: `process_cpu` samples in nanoseconds
# (wall clock when `oncpu=False`, see otel_gpu/profiling.py).
PROFILE_TYPE = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
# What `otel-gpu trace analyze --push` sends: GPU time by launching code (otel_gpu/trace/gpu_push.py)
GPU_TIME_PROFILE_TYPE = "gpu_time:gpu_time:nanoseconds:gpu_time:nanoseconds"

SCHEMA_VERSION = 39   # Grafana 11 dashboard schema
UNITS = {"percentunit", "Bps", "s", "ms", "bytes", "watt", "celsius", "hertz", "short",
         "ops", "none", "percent", "cps"}

# Label selectors, by what a series describes (labels as the OTLP translation names them).
NODE = 'host_name=~"$node"'
GPU = 'host_name=~"$node", otelgpu_gpu_index=~"$gpu"'
JOB = 'otelgpu_job=~"$job", host_name=~"$node"'
RANK = 'otelgpu_job=~"$job", host_name=~"$node", otelgpu_rank=~"$rank"'

# Threshold steps (Grafana: the first step has value None and means "below the next").
LOW_IS_BAD = [{"color": "red", "value": None}, {"color": "orange", "value": 0.4}, {"color": "green", "value": 0.7}]
HIGH_IS_BAD = [{"color": "green", "value": None}, {"color": "orange", "value": 0.7}, {"color": "red", "value": 0.9}]
ANY_IS_BAD = [{"color": "green", "value": None}, {"color": "red", "value": 1e-9}]
NEUTRAL = [{"color": "blue", "value": None}]


@attr.s
class PromTarget(g.Target):
    """A PromQL query on the stack's Prometheus (no Graphite/legacy fields)."""

    def to_json_data(self):
        return {"datasource": PROMETHEUS, "editorMode": "code", "expr": self.expr,
                "instant": self.instant, "range": not self.instant,
                "legendFormat": self.legendFormat, "refId": self.refId}


@attr.s
class PyroscopeTarget:
    """A profile query on the Pyroscope datasource (`queryType: profile` gives the flame graph).

    `label_selector` is Pyroscope's label selector, e.g. `{job=~"$job", rank="3"}`.
    """

    label_selector = attr.ib(validator=attr.validators.instance_of(str))
    profile_type = attr.ib(default=PROFILE_TYPE)
    refId = attr.ib(default="A")
    group_by = attr.ib(factory=list)

    def to_json_data(self):
        return {"datasource": PYROSCOPE, "groupBy": self.group_by, "labelSelector": self.label_selector,
                "profileTypeId": self.profile_type, "queryType": "profile", "refId": self.refId,
                "spanSelector": []}


@attr.s
class FlameGraph(g.Panel):
    """Grafana's built-in flame graph panel (Grafana 10+), fed by one PyroscopeTarget."""

    def to_json_data(self):
        return self.panel_json({"datasource": PYROSCOPE, "options": {}, "type": "flamegraph"})


def _check(title: str, description: str, unit: str | None = None) -> None:
    if not description or "\n" in description:
        raise ValueError(f"panel {title!r}: needs a one-line description of what to look for")
    if unit is not None and unit not in UNITS:
        raise ValueError(f"panel {title!r}: unknown unit {unit!r}")


def targets(queries) -> list[PromTarget]:
    """[(expr, legend), ...] -> PromTargets A, B, C ..."""
    return [PromTarget(expr=e, legendFormat=legend, refId=chr(ord("A") + i)) for i, (e, legend) in enumerate(queries)]


def timeseries(title: str, description: str, queries, unit: str, *, thresholds=None, max_value=None,
               stack: bool = False, calcs=("mean", "max"), overrides=(), legend: str = "table",
               fill: int = 10) -> g.TimeSeries:
    """A time series panel; `queries` is [(expr, legend format), ...]."""
    _check(title, description, unit)
    return g.TimeSeries(
        title=title, description=description, dataSource=PROMETHEUS, targets=targets(queries), unit=unit,
        valueMin=0, valueMax=max_value, thresholds=list(thresholds or NEUTRAL),
        thresholdsStyleMode="dashed" if thresholds else "off",
        stacking={"mode": "normal", "group": "A"} if stack else {}, fillOpacity=fill,
        legendDisplayMode=legend, legendPlacement="bottom", legendCalcs=list(calcs),
        tooltipMode="multi", tooltipSort="desc", overrides=list(overrides), maxDataPoints=None,
    )


def stat(title: str, description: str, queries, unit: str, *, thresholds=None, calc: str = "mean",
         instant: bool = False) -> g.Stat:
    """One value per series, coloured by `thresholds`; `instant` evaluates at the range's end."""
    _check(title, description, unit)
    tgts = targets(queries)
    for t in tgts:
        t.instant = instant
    return g.Stat(title=title, description=description, dataSource=PROMETHEUS, targets=tgts, format=unit,
                  thresholds=list(thresholds or NEUTRAL), reduceCalc=calc, colorMode="background",
                  color={"mode": "thresholds"},
                  graphMode="none" if instant else "area", textMode="value_and_name", maxDataPoints=None)


def state_timeline(title: str, description: str, queries) -> g.StateTimeline:
    """One lane per series, coloured where it has a value: alert states over time."""
    _check(title, description)
    return g.StateTimeline(
        title=title, description=description, dataSource=PROMETHEUS, targets=targets(queries),
        thresholds=[{"color": "red", "value": None}], colorMode="thresholds", mergeValues=True, showValue="never",
        legendDisplayMode="hidden", mappings=[{"type": "value", "options": {"1": {"text": "firing", "index": 0}}}],
        maxDataPoints=None)


def profile_selector(**labels: str) -> str:
    """A Pyroscope label selector matching each label against a variable: `rank="rank_b"` ->
    ``{rank=~`${rank_b:regex}`}``.

    Pyroscope's datasource interpolates `$var` with the glob format (two values -> `{a,b}`,
    which matches neither), so each variable is regex-formatted: escaped values, several as
    `(a|b)`, "All" as the variable's allValue. Backquotes keep its backslashes: in a "string",
    Pyroscope's (PromQL's) parser rejects `\\.` of a dotted host name.
    """
    return "{" + ", ".join(f"{label}=~`${{{var}:regex}}`" for label, var in labels.items()) + "}"


def flamegraph(title: str, description: str, label_selector: str, *, time_shift: str | None = None,
               profile_type: str = PROFILE_TYPE) -> FlameGraph:
    _check(title, description)
    bare = [v for v in re.findall(r"\$\{?\w+(?::\w+)?\}?", label_selector) if not v.endswith(":regex}")]
    if bare or label_selector.count("`") != 2 * label_selector.count("${"):
        raise ValueError(f"panel {title!r}: Pyroscope selectors take variables as `${{var:regex}}` in "
                         f"backquotes (profile_selector), not {label_selector!r}")
    return FlameGraph(title=title, description=description, targets=[PyroscopeTarget(label_selector, profile_type)],
                      timeShift=time_shift, maxDataPoints=None)


def right_axis(series_regex: str, unit: str, max_value=None) -> dict:
    """Field override: series whose name matches `series_regex` on a right axis in `unit`."""
    props = [{"id": "custom.axisPlacement", "value": "right"}, {"id": "unit", "value": unit}]
    if max_value is not None:
        props.append({"id": "max", "value": max_value})
    return {"matcher": {"id": "byRegexp", "options": series_regex}, "properties": props}


# ---- variables --------------------------------------------------------------------------
def variable(name: str, label: str, query: str, *, all_value: str | None = ".*", multi: bool = True,
             include_all: bool = True, sort: int = g.SORT_ALPHA_ASC) -> g.Template:
    """A Prometheus-backed variable: `query` is `label_values(selector, label)` or `query_result(...)`.

    `all_value=None` makes "All" the alternation of the listed values (so it follows the
    variables this one depends on); ".*" also matches series without the label.
    """
    t = g.Template(name=name, label=label, query=query, dataSource=PROMETHEUS, includeAll=include_all,
                   allValue=all_value if include_all else None, multi=multi,
                   refresh=g.REFRESH_ON_TIME_RANGE_CHANGE, sort=sort)
    if include_all:
        t._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return t


def custom(name: str, label: str, values, default: str, *, include_all: bool = False) -> g.Template:
    """A fixed list; with `include_all`, "All" is ".*" (also matches series without the label)."""
    t = g.Template(name=name, label=label, query=",".join(values), type="custom", default=default,
                   includeAll=include_all, allValue=".*" if include_all else None)
    if include_all and default == "All":
        t._current = {"selected": True, "text": "All", "value": "$__all"}
    return t


JOB_VAR = variable("job", "job", 'label_values({__name__=~"otelgpu_train_steps_total|otelgpu_agent_samples_total"}, otelgpu_job)')
NODE_VAR = variable("node", "node", 'label_values({__name__=~"otelgpu_train_steps_total|otelgpu_agent_samples_total", '
                    'otelgpu_job=~"$job"}, host_name)', all_value=None)
GPU_VAR = variable("gpu", "GPU", 'label_values(hw_gpu_memory_usage_bytes{host_name=~"$node"}, otelgpu_gpu_index)',
                   sort=g.SORT_NUMERIC_ASC)
RANK_VAR = variable("rank", "rank", 'label_values(otelgpu_train_steps_total{otelgpu_job=~"$job", host_name=~"$node"}, '
                    "otelgpu_rank)", sort=g.SORT_NUMERIC_ASC)


# ---- layout -----------------------------------------------------------------------------
class Layout:
    """Places panels left to right in a 24-column grid, wrapping; `row()` starts a titled row."""

    def __init__(self) -> None:
        self.panels: list = []
        self._x = self._y = self._h = 0

    def row(self, title: str) -> "Layout":
        self._newline()
        self.panels.append(g.RowPanel(title=title, gridPos=g.GridPos(h=1, w=24, x=0, y=self._y)))
        self._y += 1
        return self

    def add(self, panel, w: int = 12, h: int = 8) -> "Layout":
        if self._x + w > 24:
            self._newline()
        self.panels.append(attr.evolve(panel, gridPos=g.GridPos(h=h, w=w, x=self._x, y=self._y)))
        self._x += w
        self._h = max(self._h, h)
        return self

    def _newline(self) -> None:
        if self._x:
            self._y += self._h
        self._x = self._h = 0


def dashboard(uid: str, title: str, description: str, layout: Layout, variables, *, tags=(),
              annotations=(), time_from: str = "now-1h") -> g.Dashboard:
    """A dashboard with fixed uid, auto panel ids, shared crosshair and 30 s refresh."""
    builtin = {"builtIn": 1, "datasource": GRAFANA, "enable": True,
               "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}
    return g.Dashboard(
        uid=uid, title=title, description=description, tags=["otel-gpu", *tags], editable=True,
        panels=layout.panels, templating=g.Templating(list=list(variables)),
        annotations=g.Annotations(list=[builtin, DIAGNOSE_FINDINGS, *annotations]), schemaVersion=SCHEMA_VERSION,
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR, refresh="30s",
        time=g.Time(time_from, "now"), timezone="browser",
    ).auto_panel_ids()


# `otel-gpu diagnose --grafana URL` posts organisation annotations tagged with these (and the
# rule, severity and job); Grafana's own datasource lists those having all of them.
DIAGNOSE_TAGS = ["otel-gpu", "diagnose"]
DIAGNOSE_FINDINGS = {"datasource": GRAFANA, "enable": True, "hide": False, "iconColor": "red",
                     "name": "otel-gpu diagnose findings",
                     "target": {"type": "tags", "tags": DIAGNOSE_TAGS, "matchAny": False, "limit": 100}}


# The alerts of `otel-gpu alerts` (compose/prometheus-rules/) firing in Prometheus: its ALERTS series
def alerts_firing(matchers: str = "") -> str:
    return f'ALERTS{{alertstate="firing", alertname=~"OtelGpu.*"{", " + matchers if matchers else ""}}}'


def alerts_annotation(matchers: str = "") -> dict:
    """A marker wherever one of otel-gpu's Prometheus alerts fires (the rules in compose/prometheus-rules/)."""
    return prom_annotation("otel-gpu alerts firing", alerts_firing(matchers), "{{alertname}} ({{severity}})",
                           "{{otelgpu_job}} rank {{otelgpu_rank}} {{host_name}} GPU {{otelgpu_gpu_index}}", "red")


def prom_annotation(name: str, expr: str, title: str, text: str, color: str = "orange") -> dict:
    """A Prometheus annotation: a marker wherever `expr` returns a value."""
    return {"datasource": PROMETHEUS, "enable": True, "expr": expr, "hide": False, "iconColor": color,
            "name": name, "step": "10s", "titleFormat": title, "textFormat": text, "useValueForTime": False}
