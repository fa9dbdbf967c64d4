"""A diagnosis window: the job's series between two times, summarised per rank, GPU and node.

`Window` is plain data (rules are pure functions over it; tests build one by hand).
`fetch_window` fills it from a Prometheus-compatible server with four aggregated queries
(ranks, GPUs, nodes, one job-wide timeline), plus one retry per family when the agent's series
carry no job label (then they are selected by the hosts the job's ranks ran on).
"""
from __future__ import annotations

import math
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import names as N
from ..promql import PromClient, Series
from . import queries as Qb

MAX_POINTS = 720   # timeline resolution: at most this many steps over the window
SUB_POINTS = (720, 120)   # subquery resolution for first/last times: window / this, up to 1 h / beyond


class DiagnoseError(RuntimeError):
    """The window cannot be diagnosed (no data, no step metrics): one line for the user."""


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
    collective_by_kind: dict[str, float] = field(default_factory=dict)   # all_gather, ... -> seconds
    saves: float | None = None         # checkpoint saves that ended in the window (None: no counter)
    save_ranges: list[tuple[float, float]] = field(default_factory=list)  # (start, end) unix s, of saves seen

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

    def gpu_time_s(self) -> float:
        """GPU-seconds in the window (each GPU's active time), else rank-seconds."""
        if self.gpus:
            return sum(self.active_s(g.first_t, g.last_t) or self.duration_s for g in self.gpus)
        return sum(self.rank_wall_s(r) for r in self.ranks)

    def node(self, host: str) -> NodeStats | None:
        return next((n for n in self.nodes if n.host == host), None)

    def gpus_of(self, host: str) -> list[GpuStats]:
        return [g for g in self.gpus if g.host == host]


# ---- parsing union results (pure) ----------------------------------------------------------------

def _num(v: float) -> float | None:
    return None if v is None or math.isnan(v) or math.isinf(v) else float(v)


def split_union(result: list[Series], keys: tuple[str, ...]) -> dict[tuple[str, ...], dict[str, Any]]:
    """Group a union query's series by `keys` labels: {key tuple: {q tag: value}}."""
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for s in result:
        k = tuple(s.labels.get(name, "") for name in keys)
        out.setdefault(k, {})[s.labels.get(Qb.Q, "")] = _num(s.value)
    return out


def _increase(v: dict[str, Any], key: str, start_key: str | None = None) -> float | None:
    """Last value minus the value at the window start (0 when the series started inside it)."""
    last = v.get(key)
    if last is None:
        return None
    return max(0.0, last - (v.get(start_key or key + "0") or 0.0))


def parse_ranks(result: list[Series]) -> list[RankStats]:
    out = []
    for (host, rank), v in sorted(split_union(result, ("host_name", "otelgpu_rank")).items(), key=_rank_key):
        if v.get("steps") is None:
            continue
        phases = {}
        for k in v:
            if k.startswith("phase_"):
                x = _increase(v, k, "phase0_" + k[len("phase_"):])
                if x is not None:
                    phases[k[len("phase_"):]] = x
        coll, kinds = _tagged(v, "coll_", "coll0_"), _tagged(v, "collkind_", "collkind0_")
        out.append(RankStats(
            rank=rank, host=host, steps=_increase(v, "steps") or 0.0, step_time_s=_increase(v, "step_sum") or 0.0,
            step_count=_increase(v, "step_count") or 0.0, phases=phases,
            samples=int(v.get("n") or 0), first_t=v.get("t0"),
            last_t=v.get("t1") if v.get("t1") is not None else v.get("t1m"),
            first_step_s=v.get("first_sum"), started=v.get("steps0") is None,
            collective_s=sum(coll.values()) if coll else None, collective_by_phase=coll,
            collective_by_kind=kinds, saves=_increase(v, "saves")))
    return out


def _tagged(v: dict[str, Any], prefix: str, start_prefix: str) -> dict[str, float]:
    """Counter increases of one tagged family: {tag value: increase}."""
    out = {}
    for k in v:
        if k.startswith(prefix):
            x = _increase(v, k, start_prefix + k[len(prefix):])
            if x is not None:
                out[k[len(prefix):]] = x
    return out


def parse_save_ranges(result: list[Series], start: float, end: float) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(host, rank) -> (start, end) of each save seen in the window, from the samples of the ranks'
    latest-save start/end times: each distinct end is one save, paired with the latest start before it."""
    starts: dict[tuple[str, str], set[float]] = {}
    ends: dict[tuple[str, str], set[float]] = {}
    for s in result:
        key = (s.labels.get("host_name", ""), s.labels.get("otelgpu_rank", ""))
        into = ends if s.labels.get("otelgpu_checkpoint_event") == "end" else starts
        into.setdefault(key, set()).update(v for _, v in s.points if math.isfinite(v))
    out = {}
    for key, done in ends.items():
        begun = sorted(starts.get(key, ()))
        ranges = []
        for e in sorted(done):
            b = [x for x in begun if x <= e]
            if b and e >= start and b[-1] <= end:
                ranges.append((b[-1], e))
        out[key] = ranges
    return out


def _rank_key(item):
    (host, rank), _ = item
    return (int(rank) if rank.isdigit() else 1 << 30, rank, host)


def parse_gpus(result: list[Series]) -> list[GpuStats]:
    out = []
    groups = split_union(result, ("host_name", "hw_id", "otelgpu_gpu_index"))
    for (host, uuid, index), v in sorted(groups.items(), key=lambda kv: (kv[0][0], _int(kv[0][2]), kv[0][1])):
        if v.get("n") is None and v.get("util") is None and v.get("sm") is None:
            continue
        out.append(GpuStats(
            host=host, gpu=index, uuid=uuid, util=v.get("util"), sm=v.get("sm"), power_w=v.get("power"),
            power_limit_w=v.get("power_limit"), temp_c=v.get("temp"), temp_max_c=v.get("temp_max"),
            clock_hz=v.get("clock"), clock_max_hz=v.get("clock_max"), mem_used_b=v.get("mem_used"),
            mem_limit_b=v.get("mem_limit"),
            throttle={k[len("throttle_"):]: x for k, x in v.items() if k.startswith("throttle_") and x is not None},
            ranks=sorted((k[len("rank_"):] for k in v if k.startswith("rank_") and k != "rank_"), key=_int),
            samples=int(v.get("n") or 0), first_t=v.get("t0"), last_t=v.get("t1")))
    return out


def _int(s: str) -> int:
    return int(s) if s.isdigit() else 1 << 30


def parse_nodes(result: list[Series]) -> list[NodeStats]:
    out = []
    for (host,), v in sorted(split_union(result, ("host_name",)).items()):
        if all(x is None for x in v.values()):
            continue
        ib = v.get("ib_limit")
        kind = "infiniband" if ib else ("ethernet" if v.get("eth_limit") else "")
        out.append(NodeStats(
            host=host, cpu_busy=v.get("cpu_busy"), mem_used=v.get("mem_used"), swap_used_b=v.get("swap_used"),
            swap_pages_per_s=v.get("swap_rate"), nic_errors=v.get("nic_errors"), ib_errors=v.get("ib_errors"),
            link_Bps=v.get("ib_rate") if kind == "infiniband" else v.get("eth_rate"),
            link_limit_Bps=ib if kind == "infiniband" else v.get("eth_limit"), link_kind=kind,
            disk_write_Bps=v.get("disk_write")))
    return out


def parse_timeline(result: list[Series], start: float, end: float, step: float, ranks: int = 1) -> Timeline:
    """Series on the grid; cumulative phase seconds (`phasecum_<phase>`) become occupancy
    (`phase_<phase>`: ranks in the phase at each point)."""
    n = int(math.floor((end - start) / step + 1e-9)) + 1
    grid = [start + i * step for i in range(n)]
    tl = Timeline(t=grid)
    for s in result:
        name = s.labels.get(Qb.Q, "")
        values: list[float | None] = [None] * n
        for t, v in s.points:
            i = int(round((t - start) / step))
            if 0 <= i < n:
                values[i] = _num(v)
        if name.startswith("phasecum_"):
            tl.series["phase_" + name[len("phasecum_"):]] = occupancy(values, step, ranks)
        else:
            tl.series[name] = values
    return tl


def occupancy(cumulative: list[float | None], step: float, ranks: int) -> list[float | None]:
    """Ranks in a phase at each grid point, from the phase's cumulative seconds summed over ranks.
    An increment seen at point i ended by then: it is laid back over the points before, at most
    `ranks` x `step` seconds per point (a 90 s checkpoint seen at one point fills the 90 s before it)."""
    used = [0.0] * len(cumulative)
    prev = None
    for i, v in enumerate(cumulative):
        if v is None:
            continue
        if prev is None:   # present at the window start: counted before it; else: counted since it began
            inc = 0.0 if i == 0 else v
        else:
            inc = v - prev
        prev = v
        j = i
        while inc > 1e-9 and j >= 0:
            take = min(inc, ranks * step - used[j])
            used[j] += take
            inc -= take
            j -= 1
    return [u / step for u in used]


def estimate_interval(ranks: list[RankStats], gpus: list[GpuStats], default: float = 10.0) -> float:
    """The series' export interval (seconds): median span / (points - 1) over ranks and GPUs."""
    gaps = [(x.last_t - x.first_t) / (x.samples - 1) for x in [*ranks, *gpus]
            if x.samples >= 2 and x.first_t is not None and x.last_t is not None and x.last_t > x.first_t]
    return statistics.median(gaps) if gaps else default


# ---- fetching --------------------------------------------------------------------------------

def resolution(duration_s: float, max_points: int = MAX_POINTS) -> float:
    """Timeline step (whole seconds, >= 1) giving at most `max_points` steps over the window."""
    return float(max(1, math.ceil(duration_s / max_points)))


def fetch_window(client: PromClient, job: str | None, start: float, end: float, *,
                 require_steps: bool = True) -> Window:
    """Read the window's series; DiagnoseError when there is nothing to diagnose."""
    if end <= start:
        raise DiagnoseError(f"empty window: --to ({end:.0f}) is not after --from ({start:.0f})")
    dur = end - start
    if job is None:
        job = only_job(client, end, dur)
    w = Window(job=job, start=start, end=end)
    res = resolution(dur)
    sub = max(0.01, dur / (SUB_POINTS[0] if dur <= 3600 else SUB_POINTS[1]))
    job_sel = Qb.job_matcher(job)
    # the three summaries in parallel (the server evaluates each on its own core)
    ranks_q, gpus_q, nodes_q = _parallel(client, end, [Qb.rank_summary(job_sel, dur, sub),
                                                       Qb.gpu_summary(job_sel, dur, sub), Qb.node_summary(job_sel, dur)])
    w.ranks, w.gpus, w.nodes = parse_ranks(ranks_q), parse_gpus(gpus_q), parse_nodes(nodes_q)
    hosts = sorted({r.host for r in w.ranks if r.host})
    agent_sel = job_sel
    if job and hosts and not (w.gpus or w.nodes):   # the agent's series carry no job label: by host
        sel = Qb.hosts_matcher(hosts)
        w.gpus = parse_gpus(client.query(Qb.gpu_summary(sel, dur, sub), time=end))
        w.nodes = parse_nodes(client.query(Qb.node_summary(sel, dur), time=end))
        if w.gpus or w.nodes:
            agent_sel = sel
    if agent_sel != job_sel:
        w.notes.append("the agent's series carry no job label: read by the hosts of the job's ranks")
    what = f"job {job!r}" if job else "any job"
    if not (w.ranks or w.gpus or w.nodes):
        raise DiagnoseError(f"empty window: no otel-gpu series for {what} between "
                            f"{_iso(start)} and {_iso(end)}")
    if require_steps and not w.ranks:
        raise DiagnoseError(f"no step metrics for {what} between {_iso(start)} and {_iso(end)} "
                            f"(otelgpu_train_steps_total): instrument the training loop (otel_gpu.training) "
                            f"or pass --gpu-only")
    w.interval_s = estimate_interval(w.ranks, w.gpus)
    for x in [*w.ranks, *w.gpus]:   # a series that ended before the window did: its last point from its count
        if x.last_t is None and x.first_t is not None and x.samples:
            x.last_t = x.first_t + (x.samples - 1) * w.interval_s
    if any(r.saves for r in w.ranks):
        ranges = parse_save_ranges(client.query(Qb.checkpoint_times(job_sel, dur), time=end), start, end)
        for r in w.ranks:
            r.save_ranges = ranges.get((r.host, r.rank), [])
    w.step_s = res
    smooth = res + 2 * w.interval_s
    w.timeline = parse_timeline(client.query_range(Qb.timeline(job_sel, agent_sel, smooth), start, end, res),
                                start, end, res, ranks=max(1, len(w.ranks)))
    if len(w.ranks) > 1 and all(r.collective_s is not None for r in w.ranks):
        w.busy = parse_busy(client.query_range(Qb.rank_busy(job_sel, smooth), start, end, res), w.timeline.t)
    return w


def parse_busy(result: list[Series], grid: list[float]) -> dict[str, list[float | None]]:
    """rank -> busy seconds per step at each grid point: (step time - collective wait - checkpoint and
    eval time) / steps over the smoothing range; None where the rank completed no step."""
    step = grid[1] - grid[0] if len(grid) > 1 else 1.0
    parts: dict[str, dict[str, dict[int, float]]] = {}
    for s in result:   # points keyed by grid index (the server's timestamps are the grid's, up to rounding)
        rank = s.labels.get("otelgpu_rank", "")
        parts.setdefault(rank, {})[s.labels.get(Qb.Q, "")] = {int(round((t - grid[0]) / step)): v for t, v in s.points}
    out = {}
    for rank, p in parts.items():
        values: list[float | None] = []
        for t in range(len(grid)):
            n = p.get("bcount", {}).get(t)
            total = p.get("bsum", {}).get(t)
            if not n or n <= 0 or total is None or not math.isfinite(total):
                values.append(None)
                continue
            waited = p.get("bcoll", {}).get(t, 0.0) + p.get("bout", {}).get(t, 0.0)
            values.append(max(0.0, (total - waited) / n))
        out[rank] = values
    return out


def only_job(client: PromClient, end: float, dur: float) -> str | None:
    """The one job with step metrics in the window; DiagnoseError naming them when there are several."""
    steps = N.TRAIN_STEPS.prometheus_name()
    jobs = sorted(s.labels.get("otelgpu_job", "") for s in
                  client.query(f"count by (otelgpu_job) (last_over_time({steps}[{Qb.dur(dur)}]))", time=end))
    if len(jobs) > 1:
        shown = ", ".join(j or "(no job label)" for j in jobs[:10]) + (" ..." if len(jobs) > 10 else "")
        raise DiagnoseError(f"{len(jobs)} jobs have step metrics in the window ({shown}): pass --job")
    return jobs[0] or None if jobs else None


def _parallel(client: PromClient, at: float, exprs: list[str]) -> list[list[Series]]:
    """Instant queries at `at`, concurrently, each on its own connection; counted in `client.stats`."""
    clients = [PromClient(client.base_url, timeout=client.timeout, name=client.name) for _ in exprs]
    try:
        with ThreadPoolExecutor(len(exprs)) as pool:
            futures = [pool.submit(c.query, e, at) for c, e in zip(clients, exprs)]
            results = []
            for f in futures:
                results.append(f.result())   # the first PromError is raised here
        return results
    finally:
        st = client.stats
        for c in clients:
            c.close()
            st.queries += c.stats.queries
            st.requests += c.stats.requests
            st.errors += c.stats.errors
            st.seconds += c.stats.seconds
            st.query_seconds += c.stats.query_seconds
            for k, v in c.stats.by_endpoint.items():
                st.by_endpoint[k] = st.by_endpoint.get(k, 0) + v


def _iso(t: float) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
