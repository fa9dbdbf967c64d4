"""Node and GPU detail: one node's GPUs, links, storage, CPU and the ranks running on it.

Variables: job, node, GPU (NVML index), rank. Generate with `otel-gpu dashboards`.
"""
from otel_gpu.dashboards.panels import (
    GPU, GPU_VAR, HIGH_IS_BAD, JOB_VAR, LOW_IS_BAD, NODE, NODE_VAR, RANK, RANK_VAR, Layout, alerts_annotation,
    dashboard, right_axis, timeseries,
)

RATE = "$__rate_interval"
PER_GPU = "{{host_name}} GPU {{otelgpu_gpu_index}}"
lay = Layout()

lay.row("GPU: is it really working?")
lay.add(timeseries(
    "Utilization vs SM activity per GPU",
    "Solid utilization with SM activity far below it: the GPU is 'busy' running small or waiting kernels.",
    [(f"hw_gpu_utilization_ratio{{{GPU}}}", PER_GPU + " utilization"),
     (f"otelgpu_gpu_sm_activity_ratio{{{GPU}}}", PER_GPU + " SM activity")],
    "percentunit", max_value=1, thresholds=LOW_IS_BAD), w=12, h=9)
lay.add(timeseries(
    "SM occupancy, tensor and DRAM activity per GPU",
    "Tensor activity low while SM activity is high: math off the tensor cores; DRAM near 100%: memory-bound kernels.",
    [(f"otelgpu_gpu_sm_occupancy_ratio{{{GPU}}}", PER_GPU + " occupancy"),
     (f"otelgpu_gpu_tensor_activity_ratio{{{GPU}}}", PER_GPU + " tensor"),
     (f"otelgpu_gpu_dram_activity_ratio{{{GPU}}}", PER_GPU + " DRAM")],
    "percentunit", max_value=1), w=12, h=9)
lay.add(timeseries(
    "SM activity range within each export window",
    "A wide band (low minimum, high maximum) means sub-second stalls that the mean hides.",
    [(f"otelgpu_gpu_sm_activity_min_ratio{{{GPU}}}", PER_GPU + " min"),
     (f"otelgpu_gpu_sm_activity_max_ratio{{{GPU}}}", PER_GPU + " max")],
    "percentunit", max_value=1, fill=0), w=12)
lay.add(timeseries(
    "GPU memory used",
    "Near 100% the allocator retries and fragments; far below it a larger micro-batch may fit.",
    [(f"hw_gpu_memory_usage_bytes{{{GPU}}} / hw_gpu_memory_limit_bytes{{{GPU}}}", PER_GPU)],
    "percentunit", max_value=1, thresholds=HIGH_IS_BAD, fill=0), w=12)

lay.row("GPU: power, heat and clocks")
lay.add(timeseries(
    "Power draw against the power limit",
    "Sustained at 100% of the limit the GPU lowers its clocks (power capping): see the clock and throttle panels.",
    [(f"hw_power_watts{{{GPU}}} / hw_power_limit_watts{{{GPU}}}", PER_GPU)],
    "percentunit", max_value=1, thresholds=HIGH_IS_BAD, fill=0), w=8)
lay.add(timeseries(
    "Temperature",
    "Above about 85 C data-center GPUs throttle; one GPU much hotter than its neighbours points at cooling.",
    [(f"hw_temperature_celsius{{{GPU}}}", PER_GPU)],
    "celsius", thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 80},
                           {"color": "red", "value": 87}], fill=0), w=8)
lay.add(timeseries(
    "SM clock",
    "A clock that drops while work continues is throttling; compare with the active throttle reasons.",
    [(f'otelgpu_gpu_clock_hertz{{{GPU}, otelgpu_clock_domain="sm"}}', PER_GPU)],
    "hertz", fill=0), w=8)
lay.add(timeseries(
    "Throttle (clock event) reasons: share of time active",
    "Share of each export window a reason held; any reason other than gpu_idle or applications_clocks_setting held for long costs speed.",
    [(f"max by (host_name, otelgpu_gpu_index, otelgpu_clock_event_reason) "
      f"(otelgpu_gpu_clock_event_active{{{GPU}}})", PER_GPU + " {{otelgpu_clock_event_reason}}")],
    "percentunit", legend="hidden", calcs=(), fill=0), w=12)
lay.add(timeseries(
    "ECC errors and XID events",
    "Any increase deserves a look; a rising uncorrected count or an XID means the GPU should be drained.",
    [(f"increase(hw_errors_total{{{GPU}}}[{RATE}])", PER_GPU + " {{error_type}}")],
    "short", thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}], calcs=("max",),
    fill=0), w=12)

lay.row("Interconnect: what is it waiting for?")
lay.add(timeseries(
    "NVLink throughput per GPU and direction",
    "Intra-node collectives; H100 NVLink peaks near 450 GB/s per direction, so a few GB/s during all-reduce means waiting elsewhere.",
    [(f"otelgpu_gpu_nvlink_rate_bytes_per_second{{{GPU}}}", PER_GPU + " {{network_io_direction}}")],
    "Bps", fill=0), w=12)
lay.add(timeseries(
    "PCIe throughput per GPU and direction",
    "Host-to-device copies: near the link's limit (about 64 GB/s for Gen5 x16) the input or offload path is the bottleneck.",
    [(f"otelgpu_gpu_pcie_rate_bytes_per_second{{{GPU}}}", PER_GPU + " {{network_io_direction}}")],
    "Bps", fill=0), w=12)
lay.add(timeseries(
    "Network interfaces: throughput as share of link speed",
    "Near 100% the link is the bottleneck; per interface and direction.",
    [(f"rate(system_network_io_bytes_total{{{NODE}}}[{RATE}]) / on (host_name, network_interface_name) "
      f'group_left max by (host_name, network_interface_name) (hw_network_bandwidth_limit_bytes_per_second{{{NODE}, hw_type="network"}})',
      "{{network_interface_name}} {{network_io_direction}}")],
    "percentunit", max_value=1, thresholds=HIGH_IS_BAD, fill=0), w=12)
lay.add(timeseries(
    "InfiniBand ports: throughput and errors",
    "Bytes per port and direction; any error rate on a port (symbol, link-downed) slows every collective through it.",
    [(f"rate(hw_network_io_bytes_total{{{NODE}}}[{RATE}])",
      "{{otelgpu_ib_device}}:{{otelgpu_ib_port}} {{network_io_direction}}"),
     (f"sum by (host_name, otelgpu_ib_device, otelgpu_ib_port) (rate(otelgpu_ib_errors_total{{{NODE}}}[{RATE}]))",
      "{{otelgpu_ib_device}}:{{otelgpu_ib_port}} errors/s")],
    "Bps", overrides=[right_axis(".*errors/s", "short")], fill=0), w=12)

lay.row("Storage, CPU and memory")
lay.add(timeseries(
    "Storage throughput per device",
    "Checkpoint writes and dataset reads; a write burst that coincides with SM activity dips is a checkpoint stall.",
    [(f"rate(system_disk_io_bytes_total{{{NODE}}}[{RATE}])", "{{system_device}} {{disk_io_direction}}")],
    "Bps", fill=0), w=8)
lay.add(timeseries(
    "Storage busy time per device",
    "Share of time the device had I/O in flight: near 100% the device is saturated.",
    [(f"rate(system_disk_io_time_seconds_total{{{NODE}}}[{RATE}])", "{{system_device}}")],
    "percentunit", max_value=1, thresholds=HIGH_IS_BAD, fill=0), w=8)
lay.add(timeseries(
    "Checkpoint filesystem used",
    "A full checkpoint filesystem fails the next save; plan cleanup before 90%.",
    [(f"system_filesystem_utilization_ratio{{{NODE}}}", "{{system_filesystem_mountpoint}}")],
    "percentunit", max_value=1, thresholds=HIGH_IS_BAD, fill=0), w=8)
lay.add(timeseries(
    "CPU time by mode",
    "Headroom for data loading: idle near 0 starves the input pipeline; iowait means threads block on storage.",
    [(f"avg by (cpu_mode) (system_cpu_utilization_ratio{{{NODE}}})", "{{cpu_mode}}")],
    "percentunit", max_value=1, stack=True, calcs=("mean",)), w=12)
lay.add(timeseries(
    "Host memory used and load",
    "Memory near 100% makes the kernel reclaim; load far above the CPU count means runnable threads wait.",
    [(f"system_memory_utilization_ratio{{{NODE}}}", "memory used"),
     (f"system_cpu_load_average_1m{{{NODE}}} / system_cpu_logical_count{{{NODE}}}", "load per CPU")],
    "percentunit", thresholds=HIGH_IS_BAD, fill=0), w=12)

lay.row("Ranks on this node")
# The agent learns a process's rank from its environment, but its job only when told
# (docs/deploy.md): keep the processes whose node and rank the job's own series name.
PROCESS = 'host_name=~"$node", otelgpu_rank=~"$rank"'
OF_JOB = f" and on (host_name, otelgpu_rank) otelgpu_train_steps_total{{{RANK}}}"
lay.add(timeseries(
    "CPU per rank process",
    "100% is one core: a rank pinned at 100% is bound by one Python thread (data loading, the launch loop).",
    [(f"process_cpu_utilization_ratio{{{PROCESS}}}{OF_JOB}", "rank {{otelgpu_rank}} pid {{process_pid}}")],
    "percentunit", fill=0), w=8)
lay.add(timeseries(
    "Resident memory per rank process",
    "Steady growth across steps is a host-memory leak (pinned buffers, cached batches).",
    [(f"process_memory_usage_bytes{{{PROCESS}}}{OF_JOB}", "rank {{otelgpu_rank}} pid {{process_pid}}")],
    "bytes", fill=0), w=8)
lay.add(timeseries(
    "Step time of the selected ranks",
    "Mean step time per rank: compare with the GPU panels above to see what a slow step waited for.",
    [(f"rate(otelgpu_train_step_duration_seconds_sum{{{RANK}}}[{RATE}]) / "
      f"rate(otelgpu_train_step_duration_seconds_count{{{RANK}}}[{RATE}])", "rank {{otelgpu_rank}}")],
    "s", fill=0), w=8)

dashboard = dashboard(
    "otelgpu-node", "otel-gpu / Node and GPU detail",
    "One node: every GPU's activity, power and clocks, its links against their limits, storage, CPU, "
    "and the rank processes running there.",
    lay, [JOB_VAR, NODE_VAR, GPU_VAR, RANK_VAR], tags=["node"], annotations=[alerts_annotation(NODE)])
