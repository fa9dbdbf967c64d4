"""Profiles: where in the code the ranks spend wall time, cut by job, node, rank and phase.

Flame graphs on the Pyroscope datasource (pyroscope-io in every rank, see otel_gpu/profiling.py), and
GPU time by launching code from traces (`otel-gpu trace analyze DIR --push URL --job NAME`).
The job, node and rank lists come from the training metrics, whose labels carry the same values
as the profile labels (`job`, `node`, `rank`; `phase` is set per thread by the phase hooks).
Generate with `otel-gpu dashboards`.
"""
from otel_gpu.dashboards.panels import (
    GPU_TIME_PROFILE_TYPE, JOB_VAR, NODE_VAR, RANK, RANK_VAR, Layout, custom, dashboard, flamegraph,
    profile_selector, timeseries, variable,
)
from otel_gpu.names import PHASE_NAMES

RANK_B_VAR = variable("rank_b", "compare with rank",
                      'label_values(otelgpu_train_steps_total{otelgpu_job=~"$job"}, otelgpu_rank)',
                      multi=False, include_all=False, sort=3)
PHASE_VAR = custom("phase", "phase", PHASE_NAMES, "All", include_all=True)
SHIFT_VAR = custom("shift", "compare with", ("1h", "6h", "1d", "7d"), "1h")

# Pyroscope's labels carry the values of otelgpu_job, host_name, otelgpu_rank, otelgpu_phase
SELECTED = profile_selector(job="job", node="node", rank="rank", phase="phase")
lay = Layout()

lay.row("Pick a time range")
lay.add(timeseries(
    "Phase share of the selected ranks",
    "Select a range here (drag) where a phase grows: the flame graphs below then show which code it ran.",
    [(f"avg by (otelgpu_phase) (rate(otelgpu_train_phase_time_seconds_total{{{RANK}}}[$__rate_interval]))",
      "{{otelgpu_phase}}")],
    "percentunit", stack=True, max_value=1, calcs=("mean",), fill=60), w=24, h=6)

lay.row("Where in the code")
lay.add(flamegraph(
    "Wall time of the selected ranks and phase",
    "Wide frames are where time goes; wall clock, so frames blocked in a collective, a lock or I/O are wide too.",
    SELECTED), w=24, h=14)

lay.row("Compare two ranks")
lay.add(flamegraph(
    "Rank $rank",
    "Compare with the rank on the right: a frame much wider here is where this rank loses time.",
    profile_selector(job="job", rank="rank", phase="phase")), w=12, h=14)
lay.add(flamegraph(
    "Rank $rank_b",
    "The reference rank: frames missing here but wide on the left are the straggler's extra work or waiting.",
    profile_selector(job="job", rank="rank_b", phase="phase")), w=12, h=14)

lay.row("GPU time by launching code (from profiler traces)")
lay.add(flamegraph(
    "GPU time of the selected ranks by the code that launched it",
    "Kernels, copies and memsets under the Python frames and ops that launched them, from traces pushed by "
    "otel-gpu trace analyze --push --job: wide frames are the code that costs GPU time.",
    profile_selector(job="job", rank="rank"), profile_type=GPU_TIME_PROFILE_TYPE), w=24, h=14)

lay.row("Compare two time ranges")
lay.add(flamegraph(
    "Selected range",
    "The current time range; compare frame widths with the earlier range on the right.",
    SELECTED), w=12, h=14)
lay.add(flamegraph(
    "Same range, $shift earlier",
    "The same selection shifted back: frames that grew since then are the regression.",
    SELECTED, time_shift="$shift"), w=12, h=14)

dashboard = dashboard(
    "otelgpu-profiles", "otel-gpu / Profiles",
    "Continuous wall-clock flame graphs of the training ranks by job, node, rank and phase, with "
    "rank-to-rank and before/after comparisons, and GPU time by launching code from pushed traces.",
    lay, [JOB_VAR, NODE_VAR, RANK_VAR, RANK_B_VAR, PHASE_VAR, SHIFT_VAR], tags=["profiles"], time_from="now-15m")
