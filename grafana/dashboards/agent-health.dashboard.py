"""Agent health: which node agents report, which sources read, how long reads take, what was dropped.

Source health is exported as data by the agent itself (otel_gpu/agent/). Generate with
`otel-gpu dashboards`.
"""
from otel_gpu.dashboards.panels import ANY_IS_BAD, NODE, Layout, dashboard, stat, timeseries, variable

RATE = "$__rate_interval"
NODE_VAR = variable("node", "node", "label_values(otelgpu_agent_samples_total, host_name)")
lay = Layout()

lay.row("Reporting")
lay.add(stat(
    "Agents reporting",
    "Nodes whose agent exported in the last five minutes: fewer than the nodes you run on means an agent is down.",
    [(f"count(count by (host_name) (otelgpu_agent_samples_total{{{NODE}}}))", "agents")],
    "short", calc="lastNotNull"), w=6, h=5)
lay.add(stat(
    "Sources down",
    "Sources whose last read failed, over all nodes: any is a blind spot (missing driver, permissions, a lost GPU).",
    [(f"count(otelgpu_agent_source_up{{{NODE}}} == 0) or vector(0)", "down")],
    "short", thresholds=ANY_IS_BAD, calc="lastNotNull"), w=6, h=5)
lay.add(stat(
    "Seconds since the last export, per node",
    "Should stay below two export intervals; a growing value is an agent that stopped or cannot reach the collector.",
    [(f"max by (host_name) (time() - timestamp(otelgpu_agent_samples_total{{{NODE}}}))", "{{host_name}}")],
    "s", thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 30},
                     {"color": "red", "value": 120}], calc="lastNotNull", instant=True), w=12, h=5)

lay.row("Sources")
lay.add(timeseries(
    "Sources up",
    "1 when the source's last read succeeded; a source stuck at 0 exports nothing for its hardware.",
    [(f"min by (host_name, otelgpu_source) (otelgpu_agent_source_up{{{NODE}}})", "{{host_name}} {{otelgpu_source}}")],
    "short", thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}], calcs=("min",),
    fill=0), w=12)
lay.add(timeseries(
    "Read duration per source",
    "Time one read takes: near the sampling interval (default 1 s) the agent overruns and readings get coarser.",
    [(f"max by (host_name, otelgpu_source) (otelgpu_agent_source_duration_seconds{{{NODE}}})",
      "{{host_name}} {{otelgpu_source}}")],
    "s", thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.1},
                     {"color": "red", "value": 0.5}], fill=0), w=12)
lay.add(timeseries(
    "Read errors per source",
    "Failed reads per second, whole source or one part (one GPU, one field): steady errors hide that part's data.",
    [(f"sum by (host_name, otelgpu_source) (rate(otelgpu_agent_source_errors_total{{{NODE}}}[{RATE}]))",
      "{{host_name}} {{otelgpu_source}}")],
    "short", thresholds=ANY_IS_BAD, fill=0), w=12)

lay.row("Exports and sampling")
lay.add(timeseries(
    "Dropped exports",
    "OTLP exports that failed or timed out, whose data points are lost: any means the collector was unreachable or slow.",
    [(f"increase(otelgpu_agent_export_failures_total{{{NODE}}}[{RATE}])", "{{host_name}}")],
    "short", thresholds=ANY_IS_BAD, calcs=("max",), fill=0), w=12)
lay.add(timeseries(
    "Sampling rounds and overruns per second",
    "Rounds should equal 1 / interval; overruns mean a read took longer than the interval (see read durations).",
    [(f"rate(otelgpu_agent_samples_total{{{NODE}}}[{RATE}])", "{{host_name}} rounds/s"),
     (f"rate(otelgpu_agent_sample_overrun_total{{{NODE}}}[{RATE}])", "{{host_name}} overruns/s")],
    "short", fill=0), w=12)

dashboard = dashboard(
    "otelgpu-agent-health", "otel-gpu / Agent health",
    "The node agents themselves: who reports, which sources read, how long reads take, exports dropped.",
    lay, [NODE_VAR], tags=["agent"])
