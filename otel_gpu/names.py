"""Every metric name, unit and attribute otel-gpu emits, defined once.

OpenTelemetry semantic-convention names where they exist (`hw.*`, `system.*`,
`process.*`); everything semconv lacks lives under the one prefix `otelgpu.`.
docs/metrics.md is checked against this module by a test.
"""
from __future__ import annotations

from .readings import MetricSpec

PREFIX = "otelgpu."

# ---- attribute keys -------------------------------------------------------
HW_ID = "hw.id"                      # GPU UUID (MIG: the MIG device UUID)
HW_NAME = "hw.name"
HW_VENDOR = "hw.vendor"
HW_TYPE = "hw.type"                  # "gpu" | "network"
HW_PARENT = "hw.parent"              # MIG: UUID of the parent GPU
HW_STATE = "hw.state"                # "ok" | "failed"
GPU_TASK = "hw.gpu.task"             # "general" (NVML does not split by task)
GPU_INDEX = "otelgpu.gpu.index"      # NVML index, for humans; join on hw.id
MIG_PROFILE = "otelgpu.mig.profile"  # e.g. "1g.10gb"
DIRECTION = "network.io.direction"   # "transmit" | "receive"
DISK_DIRECTION = "disk.io.direction" # "read" | "write"
IFACE = "network.interface.name"
DEVICE = "system.device"
MOUNTPOINT = "system.filesystem.mountpoint"
FS_STATE = "system.filesystem.state"  # "used" | "free"
CPU_MODE = "cpu.mode"
MEMORY_STATE = "system.memory.state"
PAGING_STATE = "system.paging.state"
PAGING_DIRECTION = "system.paging.direction"   # in | out
ERROR_TYPE = "error.type"
CLOCK_DOMAIN = "otelgpu.clock.domain"       # "sm" | "memory"
CLOCK_REASON = "otelgpu.clock_event.reason"  # NVML clock-event reason, snake_case
DRIVER_VERSION = "otelgpu.driver.version"    # NVIDIA driver version, e.g. "590.48.01"
PID = "process.pid"
EXECUTABLE = "process.executable.name"
RANK = "otelgpu.rank"
LOCAL_RANK = "otelgpu.local_rank"
WORLD_SIZE = "otelgpu.world_size"
JOB = "otelgpu.job"
HOST = "host.name"
SOURCE = "otelgpu.source"
PHASE = "otelgpu.phase"
IB_DEVICE = "otelgpu.ib.device"   # e.g. "mlx5_0"
IB_PORT = "otelgpu.ib.port"       # e.g. "1"
NVLINK_LINK = "otelgpu.nvlink.link"   # NVLink link index, "0".."17"
DTYPE = "otelgpu.dtype"           # compute dtype: fp32, tf32, bf16, fp16, fp8 (peaks.py)
# the job using a GPU (sources/gpu_owner.py): on every series of that GPU while it uses it
SLURM_JOB_ID = "slurm.job.id"     # as on the resource (identity.py); no semantic convention exists
SLURM_STEP_ID = "slurm.step.id"   # 0, 1, ..., batch, extern, interactive
K8S_POD_UID = "k8s.pod.uid"
K8S_POD_NAME = "k8s.pod.name"
K8S_NAMESPACE = "k8s.namespace.name"
K8S_CONTAINER_NAME = "k8s.container.name"   # from the kubelet's PodResources API only (sources/podresources.py)
CONTAINER_ID = "container.id"
OWNER_ATTRIBUTES = (JOB, SLURM_JOB_ID, SLURM_STEP_ID, K8S_POD_UID, K8S_POD_NAME, K8S_NAMESPACE, K8S_CONTAINER_NAME,
                    CONTAINER_ID)

_GPU = (HW_ID, HW_NAME, HW_VENDOR, HW_TYPE, GPU_INDEX)


def _g(name, unit, desc, attrs=(), source="", hardware="any", kind="gauge", windowed=False, buckets=(), companions=True):
    return MetricSpec(name, unit, kind, desc, tuple(attrs), source, hardware, windowed, companions, tuple(buckets))


# ---- GPU: NVML ------------------------------------------------------------
GPU_UTILIZATION = _g("hw.gpu.utilization", "1", "Fraction of time one or more kernels ran (NVML 'GPU utilization'; not SM activity)", _GPU + (GPU_TASK,), "nvml", "NVIDIA, not MIG", windowed=True)
GPU_MEMORY_USAGE = _g("hw.gpu.memory.usage", "By", "GPU memory in use", _GPU, "nvml", "NVIDIA", kind="updowncounter")
GPU_MEMORY_LIMIT = _g("hw.gpu.memory.limit", "By", "GPU memory size", _GPU, "nvml", "NVIDIA", kind="updowncounter")
GPU_MEMORY_UTILIZATION = _g("hw.gpu.memory.utilization", "1", "Fraction of time device memory was read or written (NVML memory utilization)", _GPU + (GPU_TASK,), "nvml", "NVIDIA, not MIG", windowed=True, companions=False)
GPU_POWER = _g("hw.power", "W", "GPU power draw", _GPU, "nvml", "NVIDIA, not MIG", windowed=True)
GPU_POWER_LIMIT = _g("hw.power.limit", "W", "GPU enforced power limit (read every 10 s)", _GPU, "nvml", "NVIDIA, not MIG")
GPU_ENERGY = _g("hw.energy", "J", "GPU energy since driver load", _GPU, "nvml", "NVIDIA Volta+, not MIG", kind="counter")
GPU_TEMPERATURE = _g("hw.temperature", "Cel", "GPU core temperature", _GPU, "nvml", "NVIDIA, not MIG")
GPU_CLOCK = _g(PREFIX + "gpu.clock", "Hz", "Current clock frequency", _GPU + (CLOCK_DOMAIN,), "nvml", "NVIDIA, not MIG", windowed=True)
GPU_CLOCK_EVENT = _g(PREFIX + "gpu.clock_event.active", "{event}", "Share of the export window the clock-event (throttle) reason was active (0..1, > 0: it was active)", _GPU + (CLOCK_REASON,), "nvml", "NVIDIA, not MIG", windowed=True, companions=False)
GPU_ERRORS = _g("hw.errors", "{error}", "ECC errors (volatile, read every 10 s) and XID events seen by the agent", _GPU + (ERROR_TYPE,), "nvml", "NVIDIA; ECC on data-center GPUs", kind="counter")
GPU_STATUS = _g("hw.status", "1", "1 for the GPU's current state (ok / failed), 0 for the other", _GPU + (HW_STATE,), "nvml", "NVIDIA", kind="updowncounter")
GPU_PCIE_IO = _g("hw.gpu.io", "By", "PCIe bytes (integrated from NVML's 20 ms PCIe throughput sample)", _GPU + (DIRECTION,), "nvml", "NVIDIA, not MIG", kind="counter")
GPU_NVLINK_IO = _g(PREFIX + "gpu.nvlink.io", "By", "NVLink data bytes, all links", _GPU + (DIRECTION,), "nvml", "NVIDIA with NVLink", kind="counter")
# health (sources/nvml_health.py), read every 10 s
GPU_REMAPPED_ROWS = _g(PREFIX + "gpu.memory.remapped_rows", "{row}", "Memory rows remapped, by the error that caused it (correctable / uncorrectable; read every 10 s)", _GPU + (ERROR_TYPE,), "nvml", "NVIDIA Ampere+ data-center", kind="updowncounter")
GPU_ROW_REMAP_PENDING = _g(PREFIX + "gpu.memory.row_remap.pending", "1", "1 when a row remap waits for a GPU reset (read every 10 s)", _GPU, "nvml", "NVIDIA Ampere+ data-center", kind="updowncounter")
GPU_ROW_REMAP_FAILED = _g(PREFIX + "gpu.memory.row_remap.failed", "1", "1 when a row remap failed (the GPU needs service; read every 10 s)", _GPU, "nvml", "NVIDIA Ampere+ data-center", kind="updowncounter")
GPU_RETIRED_PAGES = _g(PREFIX + "gpu.memory.retired_pages", "{page}", "Memory pages retired, by cause (single_bit_ecc / double_bit_ecc; read every 10 s)", _GPU + (ERROR_TYPE,), "nvml", "NVIDIA data-center before Ampere", kind="updowncounter")
GPU_NVLINK_ERRORS = _g(PREFIX + "gpu.nvlink.errors", "{error}", "NVLink data-link errors, all links (replay, recovery, crc_flit, crc_data; read every 10 s)", _GPU + (ERROR_TYPE,), "nvml", "NVIDIA with NVLink", kind="counter")
GPU_NVLINK_LINK_ERRORS = _g(PREFIX + "gpu.nvlink.link.errors", "{error}", "NVLink data-link errors of one link, for links with any (a link's series appears with its first error; read every 10 s)", _GPU + (NVLINK_LINK, ERROR_TYPE), "nvml", "NVIDIA with NVLink", kind="counter")
GPU_PCIE_REPLAYS = _g(PREFIX + "gpu.pcie.replays", "{replay}", "PCIe replays (link-level retransmissions; read every 10 s)", _GPU, "nvml", "NVIDIA", kind="counter")
GPU_PCIE_LINK_GENERATION = _g(PREFIX + "gpu.pcie.link.generation", "{generation}", "Current PCIe link generation (lowered while idle; read every 10 s)", _GPU, "nvml", "NVIDIA")
GPU_PCIE_LINK_GENERATION_MAX = _g(PREFIX + "gpu.pcie.link.generation.max", "{generation}", "Highest PCIe link generation the GPU and its slot support (read every 10 s)", _GPU, "nvml", "NVIDIA")
GPU_PCIE_LINK_WIDTH = _g(PREFIX + "gpu.pcie.link.width", "{lane}", "Current PCIe link width (read every 10 s)", _GPU, "nvml", "NVIDIA")
GPU_PCIE_LINK_WIDTH_MAX = _g(PREFIX + "gpu.pcie.link.width.max", "{lane}", "Widest PCIe link the GPU and its slot support (read every 10 s)", _GPU, "nvml", "NVIDIA")
GPU_CLOCK_LIMIT = _g(PREFIX + "gpu.clock.limit", "Hz", "Highest clock the GPU can run at (NVML max clock info: its SKU's limit, not a lock set by an admin; read every 10 s; not otelgpu.gpu.clock.max, the highest clock seen in the export window)", _GPU + (CLOCK_DOMAIN,), "nvml", "NVIDIA, not MIG")
GPU_DRIVER = _g(PREFIX + "gpu.driver", "{gpu}", "1 per GPU, with the NVIDIA driver version it runs under as otelgpu.driver.version (read every 10 s)", _GPU + (DRIVER_VERSION,), "nvml", "NVIDIA")
GPU_PEAK_FLOPS = _g(PREFIX + "gpu.peak.flops", "{flop}/s", "Dense peak arithmetic rate of the GPU per compute dtype (a MIG device: its share of the SMs), from the peak table of NVIDIA datasheets (otel_gpu/peaks.py; sparsity excluded; read once); absent for a GPU not in the table", _GPU + (DTYPE,), "nvml", "NVIDIA GPUs in the peak table")
GPU_PROCESS_MEMORY = _g(PREFIX + "gpu.process.memory.usage", "By", "GPU memory used by one process", _GPU + (PID, EXECUTABLE, RANK), "nvml", "NVIDIA")

# ---- GPU: NVML GPM (Hopper and newer) -------------------------------------
_GPM = "NVIDIA Hopper+ (GPM)"
GPU_SM_ACTIVITY = _g(PREFIX + "gpu.sm.activity", "1", "Fraction of SM cycles with at least one warp resident (GPM SM activity)", _GPU, "gpm", _GPM, windowed=True)
GPU_SM_OCCUPANCY = _g(PREFIX + "gpu.sm.occupancy", "1", "Resident warps over the SM maximum (GPM SM occupancy)", _GPU, "gpm", _GPM, windowed=True, companions=False)
GPU_TENSOR_ACTIVITY = _g(PREFIX + "gpu.tensor.activity", "1", "Fraction of cycles the tensor pipes were active (GPM, any precision)", _GPU, "gpm", _GPM, windowed=True)
GPU_DRAM_ACTIVITY = _g(PREFIX + "gpu.dram.activity", "1", "DRAM bandwidth used over peak (GPM DRAM BW utilization)", _GPU, "gpm", _GPM, windowed=True, companions=False)
GPU_NVLINK_RATE = _g(PREFIX + "gpu.nvlink.rate", "By/s", "NVLink data rate, all links (GPM)", _GPU + (DIRECTION,), "gpm", _GPM, windowed=True, companions=False)
GPU_PCIE_RATE = _g(PREFIX + "gpu.pcie.rate", "By/s", "PCIe data rate (GPM)", _GPU + (DIRECTION,), "gpm", _GPM, windowed=True, companions=False)

# ---- network: OS interfaces and InfiniBand --------------------------------
NET_IO = _g("system.network.io", "By", "Bytes through an OS network interface", (IFACE, DIRECTION), "net", kind="counter")
NET_PACKETS = _g("system.network.packet.count", "{packet}", "Packets through an OS network interface", (IFACE, DIRECTION), "net", kind="counter")
NET_ERRORS = _g("system.network.errors", "{error}", "Interface errors", (IFACE, DIRECTION), "net", kind="counter")
NET_DROPPED = _g("system.network.packet.dropped", "{packet}", "Dropped packets", (IFACE, DIRECTION), "net", kind="counter")
NET_LIMIT = _g("hw.network.bandwidth.limit", "By/s", "Link speed of an interface or InfiniBand port, per direction", (HW_ID, HW_TYPE, IFACE, IB_DEVICE, IB_PORT), "net, infiniband")
IB_IO = _g("hw.network.io", "By", "InfiniBand/RoCE port data bytes (RDMA included; 64-bit counters preferred)", (HW_ID, HW_TYPE, IB_DEVICE, IB_PORT, DIRECTION), "infiniband", "InfiniBand / RoCE HCA", kind="counter")
IB_PACKETS = _g("hw.network.packets", "{packet}", "InfiniBand/RoCE port packets", (HW_ID, HW_TYPE, IB_DEVICE, IB_PORT, DIRECTION), "infiniband", "InfiniBand / RoCE HCA", kind="counter")
IB_ERRORS = _g(PREFIX + "ib.errors", "{error}", "InfiniBand port error counters (symbol, link-downed, rcv, xmit-discard ...)", (HW_ID, HW_TYPE, IB_DEVICE, IB_PORT, ERROR_TYPE), "infiniband", "InfiniBand / RoCE HCA", kind="counter")
IB_UP = _g("hw.network.up", "1", "1 when the port state is ACTIVE", (HW_ID, HW_TYPE, IB_DEVICE, IB_PORT), "infiniband", "InfiniBand / RoCE HCA")

# ---- storage ---------------------------------------------------------------
DISK_IO = _g("system.disk.io", "By", "Bytes read/written by a block device", (DEVICE, DISK_DIRECTION), "disk", kind="counter")
DISK_OPERATIONS = _g("system.disk.operations", "{operation}", "Completed reads/writes", (DEVICE, DISK_DIRECTION), "disk", kind="counter")
DISK_OPERATION_TIME = _g("system.disk.operation_time", "s", "Time spent in reads/writes (sum over requests)", (DEVICE, DISK_DIRECTION), "disk", kind="counter")
DISK_IO_TIME = _g("system.disk.io_time", "s", "Time the device had I/O in flight", (DEVICE,), "disk", kind="counter")
FS_USAGE = _g("system.filesystem.usage", "By", "Filesystem space used / free (the checkpoint directory's filesystem)", (DEVICE, MOUNTPOINT, FS_STATE), "disk", kind="updowncounter")
FS_UTILIZATION = _g("system.filesystem.utilization", "1", "Fraction of the filesystem used", (DEVICE, MOUNTPOINT), "disk")

# ---- host --------------------------------------------------------------------
CPU_UTILIZATION = _g("system.cpu.utilization", "1", "Share of all CPUs' time per mode (user, system, iowait, idle ...)", (CPU_MODE,), "host", windowed=True)
CPU_COUNT = _g("system.cpu.logical.count", "{cpu}", "Logical CPUs (read every 10 s)", (), "host", kind="updowncounter")
MEMORY_USAGE = _g("system.memory.usage", "By", "Memory per state (used, free, cached, buffered)", (MEMORY_STATE,), "host", kind="updowncounter")
MEMORY_LIMIT = _g("system.memory.limit", "By", "Total memory", (), "host", kind="updowncounter")
MEMORY_UTILIZATION = _g("system.memory.utilization", "1", "Fraction of memory used", (), "host", windowed=True, companions=False)
PAGING_USAGE = _g("system.paging.usage", "By", "Swap used / free (read every 10 s)", (PAGING_STATE,), "host", kind="updowncounter")
PAGING_OPERATIONS = _g("system.paging.operations", "{operation}", "Pages swapped in/out (read every 10 s)", (PAGING_DIRECTION,), "host", kind="counter")
LOAD_1M = _g("system.cpu.load_average.1m", "{run_queue_item}", "1-minute load average", (), "host")

# ---- training processes -------------------------------------------------------
_PROC = (PID, EXECUTABLE, RANK)
PROCESS_CPU_UTILIZATION = _g("process.cpu.utilization", "1", "CPU used by the process over one core's time (can exceed 1)", _PROC, "process", windowed=True)
PROCESS_MEMORY = _g("process.memory.usage", "By", "Resident set size", _PROC, "process", kind="updowncounter")
PROCESS_DISK_IO = _g("process.disk.io", "By", "Bytes read/written by the process (storage layer)", _PROC + (DISK_DIRECTION,), "process", kind="counter")

# ---- agent health -------------------------------------------------------------
SOURCE_UP = _g(PREFIX + "agent.source.up", "{status}", "1 when the source's last read succeeded", (SOURCE,), "agent")
SOURCE_DURATION = _g(PREFIX + "agent.source.duration", "s", "Duration of the source's last read", (SOURCE,), "agent")
SOURCE_ERRORS = _g(PREFIX + "agent.source.errors", "{error}", "Failed reads (whole source, or a part such as one GPU or field); with error.type: what a source dropped, by reason (process_pid_invalid, process_not_found: NVML PIDs that are no process here, each once while listed); sum by source for all", (SOURCE, ERROR_TYPE), "agent", kind="counter")
EXPORT_FAILURES = _g(PREFIX + "agent.export.failures", "{export}", "OTLP exports that failed or timed out (their data points were dropped)", (), "agent", kind="counter")
SCRAPE_REFUSED = _g(PREFIX + "agent.scrape.refused", "{connection}", "Scrape-endpoint connections closed unserved: idle ones evicted for new ones (connection cap, descriptors exhausted) and ones refused", (), "agent", kind="counter")
SAMPLES = _g(PREFIX + "agent.samples", "{sample}", "Sampling rounds completed", (), "agent", kind="counter")
SAMPLE_LAG = _g(PREFIX + "agent.sample.overrun", "{sample}", "Sampling rounds that took longer than the interval", (), "agent", kind="counter")


def all_specs() -> list[MetricSpec]:
    """Every MetricSpec defined in this module (and in modules that register more)."""
    specs = [v for v in globals().values() if isinstance(v, MetricSpec)]
    return specs + [s for s in _extra if s not in specs]


_extra: list[MetricSpec] = []


def register(*specs: MetricSpec) -> None:
    """Add specs defined elsewhere (training metrics) to `all_specs()`."""
    _extra.extend(s for s in specs if s not in _extra)


def windowed_companions(spec: MetricSpec) -> tuple[MetricSpec, ...]:
    """The `.min` / `.max` over the export window of a windowed gauge (none for 0/1 flags)."""
    if not spec.companions:
        return ()
    base = spec.name if spec.name.startswith(PREFIX) else PREFIX + spec.name
    return (
        MetricSpec(base + ".min", spec.unit, "gauge", f"Minimum over the export window of {spec.name}", spec.attributes, spec.source, spec.hardware),
        MetricSpec(base + ".max", spec.unit, "gauge", f"Maximum over the export window of {spec.name}", spec.attributes, spec.source, spec.hardware),
    )


# ---- training (step/phase hooks in each rank; otel_gpu/training) -----------------
# Identity on every point: host.name, otelgpu.job (point_attributes) and the rank trio below.
PHASE_NAMES = ("forward", "backward", "optimizer", "checkpoint", "eval", "data_wait")
# Phases never inside step time (the timer keeps an evaluation pass out of the step that contains it):
# neither their seconds nor the collective waits inside them are part of any step.
OUTSIDE_STEPS = ("eval",)
# collective kind and phases of a sharded model's parameter fetch (ZeRO-3's all-gathers in the passes)
PARAM_GATHER = ("all_gather", ("forward", "backward"))
CHECKPOINT_EVENT = "otelgpu.checkpoint.event"   # "start" | "end"
_RANKED = (HOST, JOB, RANK, LOCAL_RANK, WORLD_SIZE)
# Seconds: the R10 preferred numbers (x1.26 apart) from 10 ms to 100 s, R5 (x1.6) from 1 ms and up to
# 10 min, so a median interpolated inside its bucket is within ~13% of the step times' own (report/steps.py).
_R5, _R10 = (1.0, 1.6, 2.5, 4.0, 6.3), (1.0, 1.25, 1.6, 2.0, 2.5, 3.2, 4.0, 5.0, 6.3, 8.0)
STEP_BUCKETS = tuple(round(m * 10.0 ** e, 6) for e, ms in ((-3, _R5), (-2, _R10), (-1, _R10), (0, _R10), (1, _R10),
                                                            (2, _R5)) for m in ms if m * 10.0 ** e <= 600) + (600.0,)
TRAIN_STEP_DURATION = _g(PREFIX + "train.step.duration", "s", "Wall time of one training step (host clock, no GPU sync)", _RANKED, "training", kind="histogram", buckets=STEP_BUCKETS)
TRAIN_STEPS = _g(PREFIX + "train.steps", "{step}", "Training steps completed", _RANKED, "training", kind="counter")
TRAIN_SAMPLES = _g(PREFIX + "train.samples", "{sample}", "Samples processed by this rank (rate() gives samples/s)", _RANKED, "training", kind="counter")
TRAIN_TOKENS = _g(PREFIX + "train.tokens", "{token}", "Tokens processed by this rank (rate() gives tokens/s)", _RANKED, "training", kind="counter")
FLOPS_BASIS = "otelgpu.flops.basis"   # "6N+attention" (formula, padding excluded) | "measured" (FlopCounterMode once)
TRAIN_FLOPS = _g(PREFIX + "train.flops", "{flop}", "Model FLOPs of the training batches this rank fetched (rate() gives FLOP/s); basis '6N+attention': 6 per trained and 4 per frozen matrix weight per non-padding token (2 less where its input needs no gradient) plus 12 x layers x hidden x sequence length, this rank's tensor-parallel share (training/flops.py); 'measured' (OTELGPU_FLOPS=measure): one training batch under FlopCounterMode, per sample times the samples trained on", _RANKED + (FLOPS_BASIS,), "training", kind="counter")
TRAIN_COMPUTE_DTYPE = _g(PREFIX + "train.compute.dtype", "{dtype}", "1 for the dtype this rank's model computes in (otelgpu.dtype: the autocast dtype inside its forward, else its trained weights' dtype; fp32 with TF32 matmuls allowed is tf32), seen once at its first training forward; the peak its MFU is judged against", _RANKED + (DTYPE,), "training")
TRAIN_PHASE_TIME = _g(PREFIX + "train.phase.time", "s", "Exclusive wall time spent in a phase (rate() gives its share of wall time)", _RANKED + (PHASE,), "training", kind="counter")
TRAIN_CHECKPOINTS = _g(PREFIX + "train.checkpoints", "{event}", "Checkpoint saves started / ended (start - end > 0: one in progress)", _RANKED + (CHECKPOINT_EVENT,), "training", kind="counter")
COLLECTIVE = "otelgpu.collective"   # all_reduce, all_gather, reduce_scatter, broadcast, barrier, ..., ddp_allreduce
COLLECTIVE_BASIS = "otelgpu.collective.basis"   # "host": the host blocked (gloo, CPU); "gpu": GPU-timed (NCCL)
PROCESS_GROUP = "otelgpu.process_group"         # GPU-timed: the group's description (default_pg, ...) or name; host: ''
UNMEASURED_REASON = "otelgpu.collective.unmeasured_reason"   # timing_off, ring_overflow, no_flight_recorder, ...
COLLECTIVE_BASES = ("host", "gpu")
TRAIN_COLLECTIVE_TIME = _g(PREFIX + "train.collective.time", "s", "Time in collectives inside counted steps, by collective kind, the phase it happened in ('' outside any phase or GPU-timed) and process group; basis 'host': wall time this rank's thread was blocked in the call or its wait (gloo); basis 'gpu': GPU time of the collective's kernel, waiting for the last rank included (NCCL, from the Flight Recorder). Never sum across bases", _RANKED + (COLLECTIVE, PHASE, COLLECTIVE_BASIS, PROCESS_GROUP), "training", kind="counter")
TRAIN_COLLECTIVE_COUNT = _g(PREFIX + "train.collectives", "{collective}", "GPU-timed collectives counted in otelgpu.train.collective.time, by kind and process group", _RANKED + (COLLECTIVE, COLLECTIVE_BASIS, PROCESS_GROUP), "training", kind="counter")
TRAIN_COLLECTIVE_UNMEASURED = _g(PREFIX + "train.collective.unmeasured", "{collective}", "Collectives whose time could not be measured, by reason (timing_off, ring_overflow: counted; no_flight_recorder, max_connections_1, no_records, dump_failed: 1 when the whole process is unmeasured)", _RANKED + (UNMEASURED_REASON,), "training", kind="counter")
TRAIN_CHECKPOINT_LAST = _g(PREFIX + "train.checkpoint.last", "s", "Unix time of this rank's latest checkpoint save start / end (each distinct value is one save)", _RANKED + (CHECKPOINT_EVENT,), "training")
COLLECTIVE_STATE = "otelgpu.collective.state"   # "started" | "completed": of a Flight Recorder sequence number
COLLECTIVE_STATES = ("started", "completed")
TRAIN_STEP_LAST = _g(PREFIX + "train.step.last", "s", "Unix time the rank's latest counted step ended (absent before the first)", _RANKED, "training")
TRAIN_COLLECTIVE_OPEN = _g(PREFIX + "train.collective.open", "s", "Seconds this rank's thread has been blocked in a host-timed collective that has not returned yet, at export (0: inside none; per kind seen); nested waits count once", _RANKED + (COLLECTIVE,), "training")
TRAIN_COLLECTIVE_SEQ = _g(PREFIX + "train.collective.seq", "{collective}", "Last NCCL collective sequence number this rank has started / completed on a process group (Flight Recorder; a rank behind the others' started number holds them up)", _RANKED + (PROCESS_GROUP, COLLECTIVE_STATE), "training")
# Python's garbage collector and PyTorch's CUDA caching allocator, per rank (training/gc_clock.py, training/allocator.py)
GC_GENERATION = "otelgpu.gc.generation"   # "0" | "1" | "2": the oldest generation a collection examined
TRAIN_GC_TIME = _g(PREFIX + "train.gc.time", "s", "Wall time this rank's Python garbage collector ran (gc.callbacks start to stop), by the generation collected; gen 2 is the full collection", _RANKED + (GC_GENERATION,), "training", kind="counter")
TRAIN_GC_COLLECTIONS = _g(PREFIX + "train.gc.collections", "{collection}", "Python garbage collections this rank ran, by generation", _RANKED + (GC_GENERATION,), "training", kind="counter")
CUDA_DEVICE = "otelgpu.cuda.device"   # the CUDA device ordinal as the rank sees it (after CUDA_VISIBLE_DEVICES)
_ALLOC = _RANKED + (CUDA_DEVICE,)
TRAIN_ALLOC_RESERVED = _g(PREFIX + "train.allocator.reserved", "By", "GPU memory PyTorch's caching allocator holds from CUDA on this device (torch.cuda.memory_stats reserved_bytes.all.current), at export", _ALLOC, "training", "NVIDIA (CUDA jobs)")
TRAIN_ALLOC_ALLOCATED = _g(PREFIX + "train.allocator.allocated", "By", "GPU memory in tensors (allocated_bytes.all.current), at export", _ALLOC, "training", "NVIDIA (CUDA jobs)")
TRAIN_ALLOC_INACTIVE_SPLIT = _g(PREFIX + "train.allocator.inactive_split", "By", "Free pieces of split cached blocks (inactive_split_bytes.all.current): reserved but unusable for a larger tensor; over reserved it is the fragmentation", _ALLOC, "training", "NVIDIA (CUDA jobs)")
TRAIN_ALLOC_RETRIES = _g(PREFIX + "train.allocator.retries", "{retry}", "cudaMalloc failures the allocator recovered from by freeing its whole cache and retrying (num_alloc_retries): each one synchronizes the device", _ALLOC, "training", "NVIDIA (CUDA jobs)", kind="counter")
TRAIN_ALLOC_OOMS = _g(PREFIX + "train.allocator.ooms", "{oom}", "Out-of-memory errors the allocator raised (num_ooms), caught by the job or not", _ALLOC, "training", "NVIDIA (CUDA jobs)", kind="counter")
