"""What a diagnosis reads: a window of a job's series, summarised per rank, GPU and node (plain data:
rules are pure functions over it, tests build one by hand)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


RECENT_S = 60.0   # seconds before a window's end over which `RankStats.recent_outside_s` is counted


class DiagnoseError(RuntimeError):
    """The window cannot be diagnosed (no data, no step metrics): one line for the user."""


@dataclass
class AllocatorWindow:
    """One rank's PyTorch CUDA caching allocator on one device over the window: counts are increases in the
    window, bytes peaks or means of the exported values; None: not exported."""
    retries: float | None = None          # cudaMalloc retries (cache flushed, allocation retried)
    ooms: float | None = None             # out-of-memory errors raised
    reserved_max_b: float | None = None
    reserved_mean_b: float | None = None
    allocated_max_b: float | None = None
    inactive_mean_b: float | None = None  # free pieces of split blocks

    @property
    def fragmentation(self) -> float | None:
        """Mean inactive-split bytes over mean reserved bytes (0..1); None without both."""
        if self.inactive_mean_b is None or not self.reserved_mean_b:
            return None
        return self.inactive_mean_b / self.reserved_mean_b


@dataclass
class RankStats:
    """One training rank over the window; times in seconds, `first_t`/`last_t` unix seconds."""
    rank: str
    host: str
    steps: float = 0.0
    step_time_s: float = 0.0        # sum of step durations
    step_count: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # exclusive seconds per phase
    samples: int = 0
    first_t: float | None = None
    last_t: float | None = None
    first_step_s: float | None = None  # time counted at the first point: steps, checkpoint and eval phases
    started: bool = False              # the step counter started inside the window
    collective_s: float | None = None  # seconds blocked in collectives inside steps; None: not measured
    collective_by_phase: dict[str, float] = field(default_factory=dict)  # phase ('' = none) -> seconds
    collective_by_kind: dict[str, float] = field(default_factory=dict)   # all_gather, ... -> seconds (outside eval:
                                                                         # they add up to collective_s)
    param_gather_s: float = 0.0        # of those, all-gathers inside forward/backward (a sharded model's parameter fetch)
    collective_basis: str = ""         # "host" (blocked host time), "gpu" (GPU-timed, NCCL), "mixed", "" (none)
    collective_unmeasured: dict[str, float] = field(default_factory=dict)  # reason -> collectives not measured
    saves: float | None = None         # checkpoint saves that ended in the window (None: no counter)
    save_ranges: list[tuple[float, float]] = field(default_factory=list)  # (start, end) unix s, of saves seen
    # what a stall is judged on (diagnose/stall.py): gauges at the rank's last point in the window
    step_last_t: float | None = None   # unix s its latest step ended (otelgpu.train.step.last); None: not exported
    steps_total: float | None = None   # its step counter's value there (since it started, not the window's increase)
    life_step_s: float | None = None   # its mean step since it started (cumulative step time / steps)
    collective_open: dict[str, float] = field(default_factory=dict)  # kind -> seconds inside a host-timed wait not
                                                                       # returned yet (0: none); empty: not exported
    collective_seq: dict[str, dict[str, float]] = field(default_factory=dict)  # process group -> {"started": n,
                                                                                # "completed": n} (NCCL)
    recent_outside_s: float | None = None  # checkpoint and eval seconds (own time + waits) in the window's last RECENT_S
    flops: float | None = None         # model FLOPs of the batches fetched in the window (diagnose/work.py); None: not exported
    flops_basis: str = ""              # how they were counted (otelgpu.flops.basis)
    tokens: float | None = None        # tokens trained on in the window; None: not exported
    compute_dtype: str = ""            # fp32, tf32, bf16, fp16, fp8 (otelgpu.train.compute.dtype); "": not seen
    gc_s: dict[str, float] = field(default_factory=dict)   # generation ("0", "1", "2") -> seconds in Python's GC in
                                                           # the window; empty: not exported
    gc_n: dict[str, float] = field(default_factory=dict)   # generation -> collections in the window
    alloc: dict[str, "AllocatorWindow"] = field(default_factory=dict)  # CUDA device -> allocator over the window;
                                                                       # empty: not exported (no CUDA, not instrumented)

    @property
    def mean_step_s(self) -> float | None:
        return self.step_time_s / self.step_count if self.step_count > 0 else None


@dataclass
class GpuStats:
    """One GPU over the window: means and peaks (fractions 0..1, W, Celsius, Hz, bytes)."""
    host: str
    gpu: str                        # NVML index
    uuid: str = ""
    util: float | None = None       # mean NVML utilization
    sm: float | None = None         # mean GPM SM activity
    tensor: float | None = None     # mean GPM tensor-pipe activity (any precision)
    dram: float | None = None       # mean GPM DRAM bandwidth used over peak
    occupancy: float | None = None  # mean GPM SM occupancy (resident warps over the maximum)
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    temp_max_c: float | None = None
    clock_hz: float | None = None   # mean SM clock
    clock_max_hz: float | None = None
    mem_used_b: float | None = None  # peak
    mem_limit_b: float | None = None
    throttle: dict[str, float] = field(default_factory=dict)  # reason -> share of window active
    ranks: list[str] = field(default_factory=list)
    model: str = ""                   # hw.name ("" when not known)
    pcie_gen: float | None = None     # highest PCIe link generation reached in the window
    pcie_width: float | None = None   # widest PCIe link (lanes) reached in the window
    sm_clock_limit_hz: float | None = None   # the highest SM clock the GPU can run at (otelgpu.gpu.clock.limit)
    driver: str = ""                  # NVIDIA driver version ("" when not known)
    peaks: dict[str, float] = field(default_factory=dict)  # dtype -> dense peak FLOP/s (otelgpu.gpu.peak.flops)
    samples: int = 0
    first_t: float | None = None
    last_t: float | None = None

    @property
    def name(self) -> str:
        return f"{self.host}/gpu{self.gpu}"


@dataclass
class NodeStats:
    """One node over the window: shares 0..1, bytes, bytes/s, counts."""
    host: str
    cpu_busy: float | None = None         # mean share of all CPUs not idle
    mem_used: float | None = None         # peak share of host memory used
    swap_used_b: float | None = None      # peak swap in use
    swap_pages_per_s: float | None = None
    nic_errors: float | None = None       # interface errors in the window
    ib_errors: float | None = None        # InfiniBand port errors in the window
    link_Bps: float | None = None         # mean per-direction interconnect throughput (IB, else Ethernet)
    link_limit_Bps: float | None = None   # the node's port speeds, per direction
    link_kind: str = ""                   # "infiniband" | "ethernet"
    disk_write_Bps: float | None = None
    job_cpu: float | None = None          # the job's processes' CPU (ranks, their DataLoader workers), mean, in CPUs
    cpus: float | None = None             # logical CPUs of the node

    @property
    def others_cpu(self) -> float | None:
        """Share of the node's CPUs busy with processes outside the job, None where not read."""
        if self.cpu_busy is None or self.job_cpu is None or not self.cpus:
            return None
        return self.cpu_busy - self.job_cpu / self.cpus


@dataclass
class Timeline:
    """Job-wide series on a common time grid; a value is None where the series has no point."""
    t: list[float] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)

    def get(self, name: str) -> list[float | None] | None:
        return self.series.get(name)


@dataclass
class Window:
    job: str | None
    start: float
    end: float
    step_s: float = 1.0          # timeline resolution
    interval_s: float = 10.0     # estimated export interval of the series
    ranks: list[RankStats] = field(default_factory=list)
    gpus: list[GpuStats] = field(default_factory=list)
    nodes: list[NodeStats] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    profile: Any = None          # profiles.ProfileSummary when profiles were read
    profile_error: str | None = None  # why profiles could not be read (Pyroscope down, wrong API, ...)
    busy: dict[str, list[float | None]] = field(default_factory=dict)  # rank -> busy s per step, on timeline.t
    notes: list[str] = field(default_factory=list)
    train_start: float | None = None  # unix s: the ranks' first step began (estimated; None: no ranks)
    train_end: float | None = None    # unix s: the ranks' last step counter point
    source: str = "prometheus"        # "prometheus" | "recording"
    agent: bool | None = None         # the node agent ran (its series or its log are there); None: unknown

    @property
    def unit(self) -> str:
        """What time at stake is counted in: "GPU" with GPUs in the window, else "rank"."""
        return "GPU" if self.gpus else "rank"

    def training_s(self) -> float:
        """Seconds from the ranks' first step to their last (the whole window without ranks)."""
        if self.train_start is None or self.train_end is None:
            return self.duration_s
        return max(0.0, self.train_end - self.train_start)

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    def active_s(self, first_t: float | None, last_t: float | None) -> float:
        """Wall time a series covers: its span plus the export interval before its first point
        (the first point already counts what happened since the process started), within the window."""
        if first_t is None or last_t is None:
            return 0.0
        lead = min(self.interval_s, max(0.0, first_t - self.start))
        return max(0.0, min(self.duration_s, last_t - first_t + lead))

    def rank_wall_s(self, r: RankStats) -> float:
        """A rank's wall time in the window: from its first to its last step counter movement, plus,
        when it started inside the window, the time counted at its first point (steps, checkpoint and
        eval phases: the first export comes up to an interval after the first step, and first steps
        are often slow)."""
        if r.started and r.first_t is not None and r.last_t is not None and r.first_step_s is not None:
            lead = r.first_step_s + 0.5 * (r.mean_step_s or 0.0)   # + the step in progress at that point, on average
            lead = min(lead, max(0.0, r.first_t - self.start))
            return max(0.0, min(self.duration_s, r.last_t - r.first_t + lead))
        return self.active_s(r.first_t, r.last_t)

    def set_training_span(self) -> None:
        """`train_start`/`train_end` from the ranks: the earliest first step (each rank's last point minus
        its wall time) to the latest last point; unset without ranks."""
        spans = [(r.last_t - self.rank_wall_s(r), r.last_t) for r in self.ranks if r.last_t is not None and r.first_t is not None]
        if spans:
            self.train_start = max(self.start, min(a for a, _ in spans))
            self.train_end = min(self.end, max(b for _, b in spans))

    def summary_span(self) -> tuple[float, float]:
        """(from, to) unix s that the GPU and node summaries cover: training time, less the first half
        export interval (a point at t is the mean over the interval before t: it counts when at least
        half of that interval was training); the whole window without ranks."""
        if self.train_start is None or self.train_end is None:
            return self.start, self.end
        a = self.train_start + 0.5 * self.interval_s
        return (a, self.train_end) if self.train_end > a else (self.train_start, self.train_end)

    def gpu_time_s(self) -> float:
        """GPU-seconds in the window (each GPU's active time), else rank-seconds."""
        if self.gpus:
            return sum(self.active_s(g.first_t, g.last_t) or self.duration_s for g in self.gpus)
        return sum(self.rank_wall_s(r) for r in self.ranks)

    def node(self, host: str) -> NodeStats | None:
        return next((n for n in self.nodes if n.host == host), None)

    def gpus_of(self, host: str) -> list[GpuStats]:
        return [g for g in self.gpus if g.host == host]
