"""Cluster overview: is every GPU really working, what is it waiting for, which rank is slow.

Generate with `otel-gpu dashboards`; the JSON next to this file is what Grafana loads.
"""
from otel_gpu.dashboards.panels import (
    HIGH_IS_BAD, JOB, JOB_VAR, LOW_IS_BAD, NODE, NODE_VAR, Layout, alerts_annotation, dashboard, right_axis, stat,
    timeseries,
)

RATE = "$__rate_interval"
lay = Layout()

lay.row("Is the GPU really working?")
lay.add(timeseries(
    "GPU utilization vs SM activity vs tensor activity, per node",
    "Utilization only says a kernel was running; SM activity far below it means small, serialized or "
    "waiting kernels, and tensor activity far below SM activity means the math is not on tensor cores.",
    [(f"avg by (host_name) (hw_gpu_utilization_ratio{{{NODE}}})", "{{host_name}} utilization"),
     (f"avg by (host_name) (otelgpu_gpu_sm_activity_ratio{{{NODE}}})", "{{host_name}} SM activity"),
     (f"avg by (host_name) (otelgpu_gpu_tensor_activity_ratio{{{NODE}}})", "{{host_name}} tensor activity")],
    "percentunit", max_value=1, thresholds=LOW_IS_BAD), w=16, h=9)
lay.add(stat(
    "Utilization minus SM activity",
    "The share of 'busy' time in which the SMs were not: above 20 points the GPU looks busy but is not.",
    [(f"avg(hw_gpu_utilization_ratio{{{NODE}}}) - avg(otelgpu_gpu_sm_activity_ratio{{{NODE}}})", "gap")],
    "percentunit", thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.2},
                               {"color": "red", "value": 0.4}]), w=8, h=9)
lay.add(stat(
    "SM activity per GPU, mean over the range",
    "One tile per GPU: a red tile among green ones is a straggling or badly placed rank.",
    [(f"avg_over_time(otelgpu_gpu_sm_activity_ratio{{{NODE}}}[$__range])",
      "{{host_name}} GPU {{otelgpu_gpu_index}}")],
    "percentunit", thresholds=LOW_IS_BAD, instant=True), w=24, h=6)
lay.add(timeseries(
    "SM activity per GPU (lowest in each export window)",
    "The window minimum catches stalls shorter than the export interval: regular dips line up with "
    "all-gathers, checkpoints or data loading.",
    [(f"otelgpu_gpu_sm_activity_min_ratio{{{NODE}}}", "{{host_name}} GPU {{otelgpu_gpu_index}}")],
    "percentunit", max_value=1, thresholds=LOW_IS_BAD, legend="hidden", calcs=(), fill=0), w=24, h=8)

lay.row("What is it waiting for?")
lay.add(timeseries(
    "Ethernet throughput as share of link speed",
    "A link near 100% is the bottleneck; a job that should be communicating with its links far below "
    "speed is waiting on something else (latency, a straggler).",
    [(f"sum by (host_name, network_interface_name, network_io_direction) "
      f"(rate(system_network_io_bytes_total{{{NODE}}}[{RATE}])) / on (host_name, network_interface_name) "
      f"group_left max by (host_name, network_interface_name) "
      f'(hw_network_bandwidth_limit_bytes_per_second{{{NODE}, hw_type="network"}})',
      "{{host_name}} {{network_interface_name}} {{network_io_direction}}")],
    "percentunit", max_value=1, thresholds=HIGH_IS_BAD), w=12)
lay.add(timeseries(
    "InfiniBand / RoCE throughput as share of link speed",
    "Collective traffic between nodes: flat near 100% means communication-bound, a quarter of it during "
    "all-gathers means the collectives wait on something else.",
    [(f"sum by (host_name, otelgpu_ib_device, otelgpu_ib_port, network_io_direction) "
      f"(rate(hw_network_io_bytes_total{{{NODE}}}[{RATE}])) / on (host_name, otelgpu_ib_device, otelgpu_ib_port) "
      f"group_left max by (host_name, otelgpu_ib_device, otelgpu_ib_port) "
      f'(hw_network_bandwidth_limit_bytes_per_second{{{NODE}, otelgpu_ib_device!=""}})',
      "{{host_name}} {{otelgpu_ib_device}}:{{otelgpu_ib_port}} {{network_io_direction}}")],
    "percentunit", max_value=1, thresholds=HIGH_IS_BAD), w=12)
lay.add(timeseries(
    "NVLink throughput per GPU",
    "Intra-node collectives: H100 NVLink peaks near 450 GB/s per direction; uneven GPUs point at one rank.",
    [(f"sum by (host_name, otelgpu_gpu_index) (otelgpu_gpu_nvlink_rate_bytes_per_second{{{NODE}}})",
      "{{host_name}} GPU {{otelgpu_gpu_index}}")],
    "Bps", legend="hidden", calcs=(), fill=0), w=12)
lay.add(timeseries(
    "Storage writes against SM activity",
    "Checkpoint stalls: when writes rise and SM activity falls at the same moments, the GPUs wait on storage.",
    [(f'sum by (host_name) (rate(system_disk_io_bytes_total{{{NODE}, disk_io_direction="write"}}[{RATE}]))',
      "{{host_name}} write"),
     (f'sum by (host_name) (rate(system_disk_io_bytes_total{{{NODE}, disk_io_direction="read"}}[{RATE}]))',
      "{{host_name}} read"),
     (f"avg by (host_name) (otelgpu_gpu_sm_activity_ratio{{{NODE}}})", "{{host_name}} SM activity")],
    "Bps", overrides=[right_axis(".*SM activity", "percentunit", 1)]), w=12)
lay.add(timeseries(
    "CPU busy and iowait per node",
    "CPU headroom for data loading and the launcher: busy near 100% starves the input pipeline, "
    "iowait means threads block on storage.",
    [(f'1 - avg by (host_name) (system_cpu_utilization_ratio{{{NODE}, cpu_mode="idle"}})', "{{host_name}} busy"),
     (f'avg by (host_name) (system_cpu_utilization_ratio{{{NODE}, cpu_mode="iowait"}})', "{{host_name}} iowait")],
    "percentunit", max_value=1, thresholds=HIGH_IS_BAD), w=12)
lay.add(timeseries(
    "Host memory used per node",
    "Pinned buffers and data-loader workers: near 100% the kernel starts reclaiming and steps slow down.",
    [(f"system_memory_utilization_ratio{{{NODE}}}", "{{host_name}}")],
    "percentunit", max_value=1, thresholds=HIGH_IS_BAD), w=12)

lay.row("Which rank is slow?")
lay.add(timeseries(
    "Step time per rank",
    "All ranks wait for the slowest one at every collective: one line above the others is a straggler.",
    [(f"sum by (otelgpu_rank) (rate(otelgpu_train_step_duration_seconds_sum{{{JOB}}}[{RATE}])) / "
      f"sum by (otelgpu_rank) (rate(otelgpu_train_step_duration_seconds_count{{{JOB}}}[{RATE}]))",
      "rank {{otelgpu_rank}}")],
    "s", calcs=("mean", "max"), fill=0), w=16)
lay.add(stat(
    "Samples per second (job)",
    "Throughput of the whole job; compare runs and configurations by this, not by utilization.",
    [(f"sum(rate(otelgpu_train_samples_total{{{JOB}}}[{RATE}]))", "samples/s")],
    "short"), w=8)

dashboard = dashboard(
    "otelgpu-cluster", "otel-gpu / Cluster overview",
    "Per node and GPU: utilization against SM and tensor activity, interconnect and storage against "
    "their limits, CPU headroom, and step time per rank.",
    lay, [JOB_VAR, NODE_VAR], tags=["overview"], annotations=[alerts_annotation()])
