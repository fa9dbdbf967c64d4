"""A diagnosis `Window` from a recording: what `diagnose.window.fetch_window`'s PromQL computes
(diagnose/queries.py), computed over the recorded points; then the same rules run on it.

The window is the whole recording (the run's start to its end). Each statistic below names the
query part it mirrors; counters started inside the window, as a recorded run's all do.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from statistics import mean
from typing import Callable, Iterable

import numpy as np

from .. import names as N
from ..diagnose import profiles as P
from ..diagnose.queries import THROTTLE_REASONS, TIMELINE_PHASES
from ..diagnose.model import DiagnoseError, GpuStats, NodeStats, RankStats, Timeline, Window
from ..diagnose.parse import basis_of, estimate_interval, node_stats, occupancy, pair_saves
from ..diagnose.window import resolution
from .reader import Recording, Series, Summary
from .health import health_of
from .stall_inputs import stall_inputs_of
from .work import peaks_of, work_of

VIRTUAL = re.compile(r"^(|lo|docker.*|veth.*|virbr.*|br-.*|cni.*|flannel.*)$")
AGENT_LOG = "agent.log"   # `otel-gpu run` writes the node agent's messages here when it starts one
LOOKBACK_S = 300.0   # an instant vector's lookback (Prometheus' default)


Stat = tuple[Series, Summary]


def _group(items: Iterable[Stat], keys: tuple[str, ...]) -> dict[tuple, list[Stat]]:
    out: dict[tuple, list[Stat]] = defaultdict(list)
    for s, st in items:
        out[tuple(s.get(k) for k in keys)].append((s, st))
    return out


def _agg(values: Iterable[float | None], fn: Callable) -> float | None:
    vs = [v for v in values if v is not None and not math.isnan(v)]
    return fn(vs) if vs else None


def ranks_of(rec: Recording, start: float, end: float, rebase: bool = False) -> list[RankStats]:
    """rank_summary: per (host, rank) step counter, step-time histogram and phase counters; `rebase`: a
    window that starts after the run did counts what the counters counted inside it."""
    by = (N.HOST, N.RANK)

    def summaries(spec):
        return rec.summaries(spec.name, start, end, rebase=rebase)
    steps = _group(summaries(N.TRAIN_STEPS), by)
    hist = _group(summaries(N.TRAIN_STEP_DURATION), by)
    phases = _group(summaries(N.TRAIN_PHASE_TIME), by)
    coll = _group(summaries(N.TRAIN_COLLECTIVE_TIME), by)
    ckpt = _group(summaries(N.TRAIN_CHECKPOINTS), by)
    unmeasured = _group(summaries(N.TRAIN_COLLECTIVE_UNMEASURED), by)
    save_ranges = save_ranges_of(rec, start, end) if ckpt else {}
    stall = stall_inputs_of(rec, start, end)
    work = work_of(rec, start, end, rebase)
    health = health_of(rec, start, end, rebase)
    out = []
    for key, ss in steps.items():
        host, rank = key
        ph: dict[str, float] = defaultdict(float)
        for s, st in phases.get(key, []):
            ph[s.get(N.PHASE)] += st.last
        first = min(st.first_t for _, st in ss)
        # the time counted at the first point: step time, plus checkpoint/eval phases present by then
        at_first = [st.first for s, st in [*hist.get(key, []), *phases.get(key, [])] if st.first_t <= first + 1e-3
                    and (s.metric == N.TRAIN_STEP_DURATION.name or s.get(N.PHASE) in ("checkpoint", "eval"))]
        by_phase: dict[str, float] = defaultdict(float)
        by_kind: dict[str, float] = defaultdict(float)
        fetch = 0.0
        for s, st in coll.get(key, []):   # seconds in collectives, by phase and by kind (outside eval, as collective_s)
            by_phase[s.get(N.PHASE)] += st.last
            if s.get(N.PHASE) not in N.OUTSIDE_STEPS:
                by_kind[s.get(N.COLLECTIVE)] += st.last
            if s.get(N.COLLECTIVE) == N.PARAM_GATHER[0] and s.get(N.PHASE) in N.PARAM_GATHER[1]:
                fetch += st.last
        bases = {s.get(N.COLLECTIVE_BASIS) for s, _ in coll.get(key, [])}
        lost: dict[str, float] = defaultdict(float)
        for s, st in unmeasured.get(key, []):
            lost[s.get(N.UNMEASURED_REASON)] += st.last
        ends = [st.last for s, st in ckpt.get(key, []) if s.get(N.CHECKPOINT_EVENT) == "end"]
        out.append(RankStats(
            rank=rank, host=host, steps=sum(st.last for _, st in ss),
            step_time_s=sum(st.last for _, st in hist.get(key, [])),
            step_count=sum(st.last_count or 0.0 for _, st in hist.get(key, [])),
            phases=dict(ph), samples=max(st.n for _, st in ss), first_t=first,
            last_t=max(st.last_t for _, st in ss), first_step_s=sum(at_first), started=True,
            collective_s=sum(v for p, v in by_phase.items() if p not in N.OUTSIDE_STEPS) if key in coll else None,
            collective_by_phase=dict(by_phase),
            collective_by_kind=dict(by_kind), param_gather_s=fetch, collective_basis=basis_of(bases) if key in coll else "",
            collective_unmeasured={k: v for k, v in lost.items() if v}, saves=sum(ends) if ends else None,
            save_ranges=save_ranges.get(key, []), **stall.get(key, {}), **work.get(key, {}), **health.get(key, {})))
    return sorted(out, key=lambda r: (int(r.rank) if r.rank.isdigit() else 1 << 30, r.rank, r.host))


def save_ranges_of(rec: Recording, start: float, end: float) -> dict[tuple, list[tuple[float, float]]]:
    """checkpoint_times: (host, rank) -> (start, end) of each save seen, from the latest-save times."""
    starts: dict[tuple, set[float]] = defaultdict(set)
    ends: dict[tuple, set[float]] = defaultdict(set)
    for s in rec.series(N.TRAIN_CHECKPOINT_LAST.name, start, end):
        into = ends if s.get(N.CHECKPOINT_EVENT) == "end" else starts
        into[(s.get(N.HOST), s.get(N.RANK))].update(v for _, v in s.points)
    return {key: pair_saves(starts.get(key, set()), done, start, end) for key, done in ends.items()}


def gpus_of(rec: Recording, start: float, end: float) -> list[GpuStats]:
    """gpu_summary: per (host, GPU UUID, index) means, peaks, throttle shares, ranks on it."""
    by = (N.HOST, N.HW_ID, N.GPU_INDEX)
    g = lambda spec, keep=lambda s: True: _group([x for x in rec.summaries(spec.name, start, end) if keep(x[0])], by)  # noqa: E731
    util, sm, power, plimit = g(N.GPU_UTILIZATION), g(N.GPU_SM_ACTIVITY), g(N.GPU_POWER), g(N.GPU_POWER_LIMIT)
    tensor, dram, occ = g(N.GPU_TENSOR_ACTIVITY), g(N.GPU_DRAM_ACTIVITY), g(N.GPU_SM_OCCUPANCY)
    temp, mem, mlimit, procs = g(N.GPU_TEMPERATURE), g(N.GPU_MEMORY_USAGE), g(N.GPU_MEMORY_LIMIT), g(N.GPU_PROCESS_MEMORY)
    clock = g(N.GPU_CLOCK, lambda s: s.get(N.CLOCK_DOMAIN) == "sm")
    events = g(N.GPU_CLOCK_EVENT, lambda s: s.get(N.CLOCK_REASON) in THROTTLE_REASONS)
    # consistency.py: link generation and width (the highest reached), the SKU's SM clock limit, the driver
    link_gen, link_width, drivers = g(N.GPU_PCIE_LINK_GENERATION), g(N.GPU_PCIE_LINK_WIDTH), g(N.GPU_DRIVER)
    clock_limit = g(N.GPU_CLOCK_LIMIT, lambda s: s.get(N.CLOCK_DOMAIN) == "sm")
    means = lambda table, key: _agg((st.mean for _, st in table.get(key, [])), mean)  # noqa: E731
    peaks = lambda table, key: _agg((st.max for _, st in table.get(key, [])), max)  # noqa: E731
    dense = peaks_of(rec, start, end)   # dense peak FLOP/s per dtype (record/work.py)
    out = []
    for key in sorted(set(util) | set(sm) | set(mem), key=lambda k: (k[0], int(k[2]) if k[2].isdigit() else 1 << 30, k[1])):
        host, uuid, index = key
        throttle: dict[str, list[float]] = defaultdict(list)
        for s, st in events.get(key, []):
            throttle[s.get(N.CLOCK_REASON)].append(st.mean)
        ranks = sorted({s.get(N.RANK) for s, _ in procs.get(key, []) if s.get(N.RANK)},
                       key=lambda r: int(r) if r.isdigit() else 1 << 30)
        ms = [st for _, st in mem.get(key, [])]
        out.append(GpuStats(
            host=host, gpu=index, uuid=uuid, util=means(util, key), sm=means(sm, key), tensor=means(tensor, key),
            dram=means(dram, key), occupancy=means(occ, key), power_w=means(power, key),
            power_limit_w=peaks(plimit, key), temp_c=means(temp, key), temp_max_c=peaks(temp, key),
            clock_hz=means(clock, key), clock_max_hz=peaks(clock, key), mem_used_b=peaks(mem, key),
            mem_limit_b=peaks(mlimit, key), throttle={k: mean(v) for k, v in throttle.items()}, ranks=ranks,
            peaks=dense.get(key, {}),
            model=min((s.get(N.HW_NAME) for s, _ in mem.get(key, []) if s.get(N.HW_NAME)), default=""),
            pcie_gen=peaks(link_gen, key), pcie_width=peaks(link_width, key),
            sm_clock_limit_hz=peaks(clock_limit, key), driver=latest_label(drivers.get(key, []), N.DRIVER_VERSION),
            samples=max((st.n for st in ms), default=0), first_t=min((st.first_t for st in ms), default=None),
            last_t=max((st.last_t for st in ms), default=None)))
    return out


def latest_label(series: list, key: str) -> str:
    """The attribute `key` of the series seen last ("" when none has it)."""
    seen = [(st.last_t, s.get(key)) for s, st in series if s.get(key)]
    return max(seen)[1] if seen else ""


def nodes_of(rec: Recording, start: float, end: float) -> list[NodeStats]:
    """node_summary: per host CPU, memory, swap, NIC/IB errors and throughput against link speed, disk writes."""
    hosts: dict[str, dict[str, float | None]] = defaultdict(dict)

    def per_host(spec, keep=lambda s: True) -> dict[str, list[Stat]]:
        return {k[0]: v for k, v in _group([x for x in rec.summaries(spec.name, start, end) if keep(x[0])], (N.HOST,)).items()}

    def by_dir_max_sum(ss: list[Stat]) -> float | None:   # max over directions of the summed rates
        dirs: dict[str, float] = defaultdict(float)
        for s, st in ss:
            if st.rate is not None:
                dirs[s.get(N.DIRECTION)] += st.rate
        return max(dirs.values()) if dirs else None

    def limits(ss: list[Stat], key: Callable[[Series], tuple]) -> float | None:
        best: dict[tuple, float] = {}
        for s, st in ss:
            best[key(s)] = max(best.get(key(s), -math.inf), st.max)
        return sum(best.values()) if best else None

    real = lambda s: not VIRTUAL.match(s.get(N.IFACE))   # noqa: E731
    for h, ss in per_host(N.CPU_UTILIZATION, lambda s: s.get(N.CPU_MODE) == "idle").items():
        hosts[h]["cpu_busy"] = 1 - mean(st.mean for _, st in ss)
    for h, ss in per_host(N.MEMORY_UTILIZATION).items():
        hosts[h]["mem_used"] = max(st.max for _, st in ss)
    for h, ss in per_host(N.PAGING_USAGE, lambda s: s.get(N.PAGING_STATE) == "used").items():
        hosts[h]["swap_used"] = max(st.max for _, st in ss)
    for h, ss in per_host(N.PAGING_OPERATIONS).items():
        hosts[h]["swap_rate"] = _agg((st.rate for _, st in ss), sum)
    for spec, key in ((N.NET_ERRORS, "nic_errors"), (N.IB_ERRORS, "ib_errors")):   # delta()
        before = {(s.get(N.HOST), tuple(sorted(s.attrs.items()))): st.last for s, st in rec.summaries(spec.name, None, start)}
        for h, ss in per_host(spec).items():
            hosts[h][key] = sum(max(0.0, st.last - before.get((h, tuple(sorted(s.attrs.items()))), 0.0)) for s, st in ss)
    for h, ss in per_host(N.IB_IO).items():
        hosts[h]["ib_rate"] = by_dir_max_sum(ss)
    for h, ss in per_host(N.NET_LIMIT, lambda s: bool(s.get(N.IB_DEVICE))).items():
        hosts[h]["ib_limit"] = limits(ss, lambda s: (s.get(N.IB_DEVICE), s.get(N.IB_PORT)))
    for h, ss in per_host(N.NET_IO, real).items():
        hosts[h]["eth_rate"] = by_dir_max_sum(ss)
    for h, ss in per_host(N.NET_LIMIT, real).items():
        hosts[h]["eth_limit"] = limits(ss, lambda s: (s.get(N.IFACE),))
    for h, ss in per_host(N.DISK_IO, lambda s: s.get(N.DISK_DIRECTION) == "write").items():
        hosts[h]["disk_write"] = _agg((st.rate for _, st in ss), sum)
    for h, ss in per_host(N.PROCESS_CPU_UTILIZATION).items():   # the job's processes, summed per reading (CPUs)
        readings = max(st.n for _, st in ss)
        hosts[h]["job_cpu"] = sum(st.mean * st.n for _, st in ss) / readings if readings else None
    for h, ss in per_host(N.CPU_COUNT).items():
        hosts[h]["cpus"] = max(st.max for _, st in ss)
    return [node_stats(h, v) for h, v in sorted(hosts.items())]


# ---- timeline ------------------------------------------------------------------------------

def _arrays(s: Series) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(s.points, dtype=float)
    return a[:, 0], a[:, 1]


def grid_avg(ss: list[Series], grid: np.ndarray, smooth: float) -> np.ndarray:
    """avg(avg_over_time(x[smooth])) at each grid time (NaN where no series has a point)."""
    total, n = np.zeros(len(grid)), np.zeros(len(grid))
    for s in ss:
        t, v = _arrays(s)
        c = np.concatenate([[0.0], np.cumsum(v)])
        lo, hi = np.searchsorted(t, grid - smooth, "right"), np.searchsorted(t, grid, "right")
        has = hi > lo
        total[has] += (c[hi] - c[lo])[has] / (hi - lo)[has]
        n[has] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def grid_rate(s: Series, grid: np.ndarray, smooth: float) -> np.ndarray:
    """rate(x[smooth]) at each grid time, without extrapolation (NaN: under two points)."""
    t, v = _arrays(s)
    lo, hi = np.searchsorted(t, grid - smooth, "right"), np.searchsorted(t, grid, "right") - 1
    ok = (hi - lo) >= 1
    out = np.full(len(grid), np.nan)
    lo_, hi_ = lo[ok], hi[ok]
    dt = t[hi_] - t[lo_]
    out[ok] = np.where(dt > 0, (v[hi_] - v[lo_]) / np.where(dt > 0, dt, 1), np.nan)
    return out


def grid_last(s: Series, grid: np.ndarray, lookback: float = LOOKBACK_S) -> np.ndarray:
    """The instant value (last point within `lookback`) at each grid time."""
    t, v = _arrays(s)
    i = np.searchsorted(t, grid, "right") - 1
    ok = (i >= 0) & (grid - t[np.clip(i, 0, None)] <= lookback)
    return np.where(ok, v[np.clip(i, 0, None)], np.nan)


def _nansum(arrays: list[np.ndarray], n: int) -> np.ndarray:
    if not arrays:
        return np.full(n, np.nan)
    a = np.vstack(arrays)
    return np.where(np.all(np.isnan(a), axis=0), np.nan, np.nansum(a, axis=0))


def _nanmax(arrays: list[np.ndarray], n: int) -> np.ndarray:
    if not arrays:
        return np.full(n, np.nan)
    a = np.vstack(arrays)
    out = np.full(n, np.nan)
    has = ~np.all(np.isnan(a), axis=0)
    out[has] = np.nanmax(a[:, has], axis=0)
    return out


def _list(a: np.ndarray) -> list[float | None]:
    return [None if math.isnan(x) else float(x) for x in a]


def timeline_of(rec: Recording, start: float, end: float, step: float, smooth: float, ranks: int) -> Timeline:
    """timeline: GPU activity, step rate, phase occupancy, disk writes, peak node IB rate."""
    n = int(math.floor((end - start) / step + 1e-9)) + 1
    grid = start + step * np.arange(n)
    tl = Timeline(t=[float(x) for x in grid])
    read = lambda spec: rec.series(spec.name, start, end, step=step)   # noqa: E731   one point per grid step
    util, sm = read(N.GPU_UTILIZATION), read(N.GPU_SM_ACTIVITY)
    if util:
        tl.series["util"] = _list(grid_avg(util, grid, smooth))
    if sm:
        tl.series["sm"] = _list(grid_avg(sm, grid, smooth))
    steps = read(N.TRAIN_STEPS)
    if steps:
        tl.series["steps"] = _list(_nansum([grid_rate(s, grid, smooth) for s in steps], n))
    by_phase: dict[str, list[Series]] = defaultdict(list)
    for s in read(N.TRAIN_PHASE_TIME):
        if s.get(N.PHASE) in TIMELINE_PHASES:
            by_phase[s.get(N.PHASE)].append(s)
    for phase, ss in by_phase.items():
        cum = _list(_nansum([grid_last(s, grid) for s in ss], n))
        tl.series["phase_" + phase] = occupancy(cum, step, ranks)
    writes = [s for s in read(N.DISK_IO) if s.get(N.DISK_DIRECTION) == "write"]
    if writes:
        tl.series["disk_write"] = _list(_nansum([grid_rate(s, grid, smooth) for s in writes], n))
    ib: dict[str, list[Series]] = defaultdict(list)
    for s in read(N.IB_IO):
        ib[s.get(N.HOST)].append(s)
    if ib:
        per_node = [_nansum([grid_rate(s, grid, smooth) for s in ss], n) for ss in ib.values()]
        tl.series["ib"] = _list(_nanmax(per_node, n))
    return tl


def busy_of(rec: Recording, start: float, end: float, grid: list[float], smooth: float) -> dict[str, list[float | None]]:
    """rank_busy: rank -> busy seconds per step at each grid time (step time minus collective wait and
    checkpoint/eval time, over steps, each an increase over `smooth` seconds)."""
    g = np.asarray(grid, dtype=float)

    def increase(points: list[tuple[float, float]]) -> np.ndarray:
        if not points:
            return np.zeros(len(g))
        series = Series("", "counter", "", {}, sorted(points))
        now, before = grid_last(series, g), grid_last(series, g - smooth)
        return np.nan_to_num(now, nan=0.0) - np.nan_to_num(before, nan=0.0)

    parts: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for s in rec.series(N.TRAIN_STEP_DURATION.name, start, end):
        rank = s.get(N.RANK)
        parts[rank]["sum"] += s.points
        parts[rank]["count"] += [(t, c) for (t, _), c in zip(s.points, s.counts)]
    for s in rec.series(N.TRAIN_COLLECTIVE_TIME.name, start, end):   # phases are own time: every wait
        if s.get(N.PHASE) not in N.OUTSIDE_STEPS:                     # but eval's: not in any step
            parts[s.get(N.RANK)]["coll"] += s.points
    for s in rec.series(N.TRAIN_PHASE_TIME.name, start, end):
        if s.get(N.PHASE) == "checkpoint":
            parts[s.get(N.RANK)]["out"] += s.points
    out = {}
    for rank, p in parts.items():
        n = increase(p["count"])
        busy = increase(p["sum"]) - increase(p["coll"]) - increase(p["out"])
        out[rank] = [float(max(0.0, b / c)) if c > 0 else None for b, c in zip(busy, n)]
    return out


def profile_of(rec: Recording) -> P.ProfileSummary | None:
    """The recorded profiles as the communication rule reads them (samples in nanoseconds)."""
    # the summary groups by rank and asks only whether a sample carries a phase: merge the rest first
    merged: dict[tuple, int] = defaultdict(int)
    for stack, value, labels, _unit in rec.profile_stacks():
        if P.is_helper(stack, labels):    # otel-gpu's own threads, by name or frames, before the names go
            continue
        merged[(tuple(stack), labels.get(P.PHASE_LABEL) is not None, labels.get("rank") or "all")] += value
    rows = [(list(reversed(stack)), value, {"rank": rank, **({P.PHASE_LABEL: "1"} if tagged else {})}, {})
            for (stack, tagged, rank), value in merged.items()]
    return P.from_samples(rows) if rows else None


def recorded_window(rec: Recording, *, require_steps: bool = True, with_profile: bool = True,
                    start: float | None = None, end: float | None = None) -> Window:
    """The recording from `start` to `end` (unix s; default: the whole recording) as a diagnosis
    window; DiagnoseError when there is nothing to diagnose."""
    span = rec.span()
    if span is None or span[1] <= span[0]:
        raise DiagnoseError(f"empty recording: no points in {', '.join(map(str, rec.dirs))}")
    rebase = start is not None and start > span[0]
    start, end = max(span[0], start if start is not None else span[0]), (span[1] if end is None else end)
    if end <= start:
        raise DiagnoseError(f"empty window: nothing recorded between {start:.0f} and {end:.0f}")
    w = Window(job=rec.job, start=start, end=end)
    w.source = "recording"
    w.ranks = ranks_of(rec, start, end, rebase)
    # GPU and node numbers over training time (first step to last step), as fetch_window's queries
    w.interval_s = estimate_interval(w.ranks, [])
    w.set_training_span()
    a, b = w.summary_span()
    w.gpus, w.nodes = gpus_of(rec, a, b), nodes_of(rec, a, b)
    w.agent = bool(w.gpus or w.nodes) or any((d / AGENT_LOG).exists() for d in rec.dirs)
    if not (w.ranks or w.gpus or w.nodes):
        raise DiagnoseError(f"empty recording: no otel-gpu series in {', '.join(map(str, rec.dirs))}")
    if require_steps and not w.ranks:
        raise DiagnoseError("no step metrics in the recording (otelgpu.train.steps): the command ran no "
                            "training loop otel-gpu knows, or pass --gpu-only")
    w.interval_s = estimate_interval(w.ranks, w.gpus)
    w.step_s = resolution(end - start)
    w.timeline = timeline_of(rec, start, end, w.step_s, w.step_s + 2 * w.interval_s, max(1, len(w.ranks)))
    if len(w.ranks) > 1 and all(r.collective_s is not None for r in w.ranks):
        w.busy = busy_of(rec, start, end, w.timeline.t, w.step_s + 2 * w.interval_s)
    if with_profile:
        w.profile = profile_of(rec)
    return w
