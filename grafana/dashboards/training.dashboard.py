"""Training: step time and throughput, where the step goes (phases), stragglers (busy time), checkpoints.

Variables: job, node, rank. Checkpoint starts are annotations. Generate with `otel-gpu dashboards`.
"""
from otel_gpu.dashboards.panels import (
    HIGH_IS_BAD, JOB, JOB_VAR, NODE_VAR, RANK, RANK_VAR, Layout, alerts_annotation, alerts_firing, dashboard,
    prom_annotation, right_axis, stat, state_timeline, timeseries,
)

RATE = "$__rate_interval"


def mean_step(sel: str) -> str:
    """Mean step time per rank over the rate window (seconds)."""
    return (f"sum by (otelgpu_rank) (rate(otelgpu_train_step_duration_seconds_sum{{{sel}}}[{RATE}])) / "
            f"sum by (otelgpu_rank) (rate(otelgpu_train_step_duration_seconds_count{{{sel}}}[{RATE}]))")


HOST = 'otelgpu_collective_basis!="gpu"'   # host-blocked collective time (gloo; '' on series older than the basis)
GPU = 'otelgpu_collective_basis="gpu"'     # GPU-timed (NCCL): includes the wait for the last rank, may overlap compute


def busy(sel: str) -> str:
    """Busy seconds per step per rank: step time minus time blocked in collectives (host basis; not those
    inside eval, which is never step time), over steps."""
    return (f"(sum by (otelgpu_rank) (rate(otelgpu_train_step_duration_seconds_sum{{{sel}}}[{RATE}])) - "
            f"(sum by (otelgpu_rank) (rate(otelgpu_train_collective_time_seconds_total{{{sel}, {HOST}, "
            f"otelgpu_phase!=\"eval\"}}[{RATE}])) or "
            f"0 * sum by (otelgpu_rank) (rate(otelgpu_train_step_duration_seconds_sum{{{sel}}}[{RATE}])))) / "
            f"sum by (otelgpu_rank) (rate(otelgpu_train_step_duration_seconds_count{{{sel}}}[{RATE}]))")


def quantile(q: float) -> str:
    return (f"histogram_quantile({q}, sum by (le) "
            f"(rate(otelgpu_train_step_duration_seconds_bucket{{{JOB}}}[{RATE}])))")


ALERTS = alerts_firing('otelgpu_job=~"$job"')
CKPT = 'otelgpu_train_checkpoints_total{otelgpu_job=~"$job", otelgpu_checkpoint_event="start"}'
lay = Layout()

lay.row("Alerts")
lay.add(state_timeline(
    "otel-gpu alerts firing (Prometheus rules)",
    "The alerts of compose/prometheus-rules/ firing for the selected jobs (GPU and agent alerts of their nodes "
    "when All): a stalled job names the rank holding it, a straggler the rank the others wait for; "
    "`otel-gpu diagnose` explains each.",
    [(f"max by (alertname, severity, otelgpu_job, otelgpu_rank, host_name) ({ALERTS})",
      "{{alertname}} ({{severity}}) {{otelgpu_job}} rank {{otelgpu_rank}} {{host_name}}")]), w=24, h=6)

lay.row("Step time and throughput")
lay.add(timeseries(
    "Step time p50 / p90 / p99, all ranks",
    "A p99 far above p50 means some steps stall (checkpoints, data loading, a straggler); the bucket edges "
    "limit precision to about a factor of two.",
    [(quantile(0.5), "p50"), (quantile(0.9), "p90"), (quantile(0.99), "p99")],
    "s", fill=0), w=12)
lay.add(timeseries(
    "Throughput: samples/s and tokens/s",
    "What the job delivers: a drop with unchanged step time means fewer samples per step, a drop with longer "
    "steps means something slowed down.",
    [(f"sum(rate(otelgpu_train_samples_total{{{JOB}}}[{RATE}]))", "samples/s"),
     (f"sum(rate(otelgpu_train_tokens_total{{{JOB}}}[{RATE}]))", "tokens/s")],
    "short", overrides=[right_axis("tokens/s", "short")], fill=0), w=12)
lay.add(timeseries(
    "Step time per rank",
    "In synchronous training every rank's step lasts as long as the slowest's: these lines move together. "
    "Which rank the others wait for is in the Stragglers row (busy time).",
    [(mean_step(RANK), "rank {{otelgpu_rank}}")], "s", fill=0), w=24)

# energy per token: NVML's energy counter is read every ~10 s or more (its cost), so rates over 10 minutes;
# per GPU where the GPU lists the ranks' processes, else all of a node's GPUs over all of its ranks' tokens
EN_WINDOW = "10m"
ON_GPU = ('group by (host_name, otelgpu_gpu_index, otelgpu_rank) (otelgpu_gpu_process_memory_usage_bytes'
          '{otelgpu_job=~"$job", host_name=~"$node", otelgpu_rank!=""})')
# one GPU's counter is split into several series where its labels change (a new owning job): max, not sum
ENERGY = f"max by (host_name, otelgpu_gpu_index) (rate(hw_energy_joules_total{{host_name=~\"$node\"}}[{EN_WINDOW}]))"
TOKENS = f"sum by (host_name, otelgpu_rank) (rate(otelgpu_train_tokens_total{{{JOB}}}[{EN_WINDOW}]))"
lay.add(timeseries(
    "Energy per token, per GPU (J/token)",
    "GPU energy (NVML's counter, read every ~10 s or more) over the tokens the ranks on that GPU counted, both as "
    "10-minute rates. A GPU that lists no rank's process (containers hiding PIDs): the node's GPUs over the "
    "node's ranks together. Tokens are non-padding ones; the run report and `otel-gpu tune` give the same ratio "
    "between energy reads.",
    [(f"(sum by (host_name, otelgpu_gpu_index) ({ENERGY}) / on (host_name, otelgpu_gpu_index) "
      f"sum by (host_name, otelgpu_gpu_index) ({TOKENS} * on (host_name, otelgpu_rank) group_right {ON_GPU})) or "
      f'label_replace((sum by (host_name) ({ENERGY}) / sum by (host_name) ({TOKENS})) unless on (host_name) {ON_GPU}, '
      f'"otelgpu_gpu_index", "all", "", "")',
      "{{host_name}} GPU {{otelgpu_gpu_index}}")],
    "short", calcs=("mean", "last"), fill=0), w=24)

# model work: FLOPs the ranks' hooks count (6·N per token + attention, or measured; otelgpu_flops_basis), over the
# dense peak of the GPU NVML lists each rank's process on, in the dtype the rank computes in (docs/mfu.md)
RJ = "otelgpu_job, host_name, otelgpu_rank"
FLOPS = f"sum by ({RJ}) (rate(otelgpu_train_flops_total{{{RANK}}}[{RATE}]))"
DTYPE = f"max by ({RJ}, otelgpu_dtype) (otelgpu_train_compute_dtype{{{RANK}}})"
RANK_GPU = f'group by ({RJ}, hw_id, otelgpu_gpu_index) (otelgpu_gpu_process_memory_usage_bytes{{{JOB}, otelgpu_rank!=""}})'
PEAK = "max by (host_name, hw_id, otelgpu_dtype) (otelgpu_gpu_peak_flops_per_second{host_name=~\"$node\"})"
lay.add(timeseries(
    "Achieved model TFLOP/s per GPU",
    "Model FLOPs per second of the ranks on each GPU (from the ranks' own count: 6·N per token plus attention, "
    "padding excluded, or one measured batch), not the GPU's own counters. A drop with unchanged step time means "
    "less work per step; set it beside the GPU's dense peak in the MFU panel.",
    [(f"sum by (host_name, otelgpu_gpu_index) ({FLOPS} * on ({RJ}) group_left (otelgpu_gpu_index) {RANK_GPU}) / 1e12",
      "{{host_name}} GPU {{otelgpu_gpu_index}}")],
    "short", calcs=("mean", "last"), fill=0), w=12)
lay.add(timeseries(
    "MFU per rank (model FLOP/s over the GPU's dense peak)",
    "Model FLOPs utilisation: the rank's model FLOP/s over the dense peak of its GPU (NVML product name) in the dtype "
    "it computes in. No line: not checked (no GPU listing the rank, a GPU not in the peak table, fp8, no dtype seen; "
    "`otel-gpu diagnose` says which). Tensor-pipe activity well above MFU is GPU work that is not the model's.",
    [(f"sum by ({RJ}, otelgpu_dtype) ({FLOPS} * on ({RJ}) group_left (otelgpu_dtype) {DTYPE}) "
      f"* on ({RJ}) group_left (hw_id) {RANK_GPU} "
      f"/ on (host_name, hw_id, otelgpu_dtype) group_left {PEAK}",
      "{{otelgpu_job}} rank {{otelgpu_rank}} ({{otelgpu_dtype}})")],
    "percentunit", calcs=("mean", "last"), fill=0), w=12)

lay.row("Where does the step go?")
lay.add(timeseries(
    "Phase breakdown, share of wall time (mean over ranks)",
    "Forward, backward and optimizer should fill the bar; data_wait or checkpoint taking a visible share "
    "is time the GPUs idle.",
    [(f"avg by (otelgpu_phase) (rate(otelgpu_train_phase_time_seconds_total{{{RANK}}}[{RATE}]))",
      "{{otelgpu_phase}}")],
    "percentunit", stack=True, max_value=1, calcs=("mean",), fill=60), w=12, h=9)
lay.add(timeseries(
    "Input wait (data_wait) per rank",
    "Share of wall time a rank waits for its next batch: above a few percent the input pipeline is the bottleneck.",
    [(f'rate(otelgpu_train_phase_time_seconds_total{{{RANK}, otelgpu_phase="data_wait"}}[{RATE}])',
      "rank {{otelgpu_rank}}")],
    "percentunit", thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.05},
                               {"color": "red", "value": 0.15}], fill=0), w=12, h=9)

lay.row("Stragglers")
lay.add(timeseries(
    "Busy time per step per rank (not waiting for peers; host-blocked collectives)",
    "Step time minus the time the rank was blocked in collectives (gloo; NCCL jobs: the GPU collective time panel): "
    "in synchronous training every rank's step "
    "lasts as long as the slowest's, so step times cannot name a straggler, busy time can. One line above the "
    "rest all the time is the rank the others wait for (otel-gpu diagnose names it and the phase that grew).",
    [(busy(RANK), "rank {{otelgpu_rank}}")], "s", calcs=("mean", "max"), fill=0), w=12)
lay.add(timeseries(
    "Time in collectives per rank, share of wall time",
    "host: the rank's thread blocked (gloo); gpu: the collectives' GPU time (NCCL, waiting for the last rank "
    "included; it may overlap compute). What every rank spends is communication cost; what one rank spends more "
    "than the others is time it waits for a straggler. The two bases are never added.",
    [(f"sum by (otelgpu_rank, otelgpu_collective_basis) "
      f"(rate(otelgpu_train_collective_time_seconds_total{{{RANK}}}[{RATE}]))",
      "rank {{otelgpu_rank}} ({{otelgpu_collective_basis}})")],
    "percentunit", calcs=("mean", "max"), fill=0), w=12)
lay.add(timeseries(
    "GPU collective time per step per rank (NCCL)",
    "GPU-timed collective seconds per step: a collective lasts until the last rank has arrived, so the lowest "
    "line all the time is the rank the others wait for, and the gap to the others is what they wait per step.",
    [(f"sum by (otelgpu_rank) (rate(otelgpu_train_collective_time_seconds_total{{{RANK}, {GPU}}}[{RATE}])) / "
      f"sum by (otelgpu_rank) (rate(otelgpu_train_step_duration_seconds_count{{{RANK}}}[{RATE}]))",
      "rank {{otelgpu_rank}}")],
    "s", calcs=("mean", "min"), fill=0), w=12)
lay.add(stat(
    "Busiest rank's busy time over the least busy's",
    "How much longer the busiest rank works per step than the least busy one: the others wait about that "
    "long for it at every step.",
    [(f"max({busy(JOB)}) / min({busy(JOB)}) - 1", "busier by")],
    "percentunit", thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.05},
                               {"color": "red", "value": 0.15}]), w=6)
lay.add(stat(
    "Steps behind the leading rank",
    "Steps completed by the leading rank minus this rank's: above zero for long, the rank is stuck or restarting.",
    [(f"scalar(max(otelgpu_train_steps_total{{{JOB}}})) - otelgpu_train_steps_total{{{RANK}}}",
      "rank {{otelgpu_rank}}")],
    "short", thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}], calc="lastNotNull",
    instant=True), w=6)

lay.row("Checkpoints")
lay.add(timeseries(
    "Checkpoint time, share of wall time per rank",
    "Time the ranks spend saving: GPUs idle for all of it unless the save is asynchronous.",
    [(f'rate(otelgpu_train_phase_time_seconds_total{{{RANK}, otelgpu_phase="checkpoint"}}[{RATE}])',
      "rank {{otelgpu_rank}}")],
    "percentunit", thresholds=HIGH_IS_BAD, fill=0), w=12)
lay.add(stat(
    "Checkpoints in progress",
    "Saves started but not finished: stuck above zero means a hung save (full filesystem, dead storage mount).",
    [(f'sum({CKPT}) - sum(otelgpu_train_checkpoints_total{{otelgpu_job=~"$job", otelgpu_checkpoint_event="end"}})',
      "in progress")],
    "short", thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}], calc="lastNotNull"),
    w=12)

checkpoints = prom_annotation(
    "Checkpoint started",
    # a save started in the last minute: the counter grew, or its series appeared (first save)
    f"(increase({CKPT}[1m]) > 0) or ({CKPT} unless {CKPT} offset 1m)",
    "checkpoint", "rank {{otelgpu_rank}} on {{host_name}}")

dashboard = dashboard(
    "otelgpu-training", "otel-gpu / Training",
    "Step time and throughput per job, the phase breakdown of each step, the slowest and fastest rank, "
    "and checkpoints (annotations); the otel-gpu alerts firing for the jobs.",
    lay, [JOB_VAR, NODE_VAR, RANK_VAR], tags=["training"],
    annotations=[checkpoints, alerts_annotation('otelgpu_job=~"$job"')])
