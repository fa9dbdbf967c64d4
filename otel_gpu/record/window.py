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
from ..diagnose.window import (DiagnoseError, GpuStats, NodeStats, RankStats, Timeline, Window, estimate_interval,
                               occupancy, resolution)
from .reader import Recording, Series

VIRTUAL = re.compile(r"^(|lo|docker.*|veth.*|virbr.*|br-.*|cni.*|flannel.*)$")
LOOKBACK_S = 300.0   # an instant vector's lookback (Prometheus' default)


def _last(s: Series) -> float:
    return s.points[-1][1]


def _at(s: Series, t: float) -> float | None:
    """The series' value at `t` (its last point at or before t), as an instant vector sees it."""
    best = None
    for pt, v in s.points:
        if pt > t:
            break
        best = v
    return best


def _rate(s: Series) -> float | None:
    (t0, v0), (t1, v1) = s.points[0], s.points[-1]
    return (v1 - v0) / (t1 - t0) if len(s.points) >= 2 and t1 > t0 else None


def _avg(s: Series) -> float:
    return mean(v for _, v in s.points)


def _group(series: Iterable[Series], keys: tuple[str, ...]) -> dict[tuple, list[Series]]:
    out: dict[tuple, list[Series]] = defaultdict(list)
    for s in series:
        out[tuple(s.get(k) for k in keys)].append(s)
    return out


def _agg(values: Iterable[float | None], fn: Callable) -> float | None:
    vs = [v for v in values if v is not None and not math.isnan(v)]
    return fn(vs) if vs else None


def ranks_of(rec: Recording, start: float, end: float) -> list[RankStats]:
    """rank_summary: per (host, rank) step counter, step-time histogram and phase counters."""
    by = (N.HOST, N.RANK)
    steps = _group(rec.series(N.TRAIN_STEPS.name, start, end), by)
    hist = _group(rec.series(N.TRAIN_STEP_DURATION.name, start, end), by)
    phases = _group(rec.series(N.TRAIN_PHASE_TIME.name, start, end), by)
    out = []
    for key, ss in steps.items():
        host, rank = key
        ph: dict[str, float] = defaultdict(float)
        for s in phases.get(key, []):
            ph[s.get(N.PHASE)] += _last(s)
        hs = hist.get(key, [])
        first = min(s.points[0][0] for s in ss)
        counted = sum(_at(s, first) or 0.0 for s in hs)
        between = [_at(s, first) for s in phases.get(key, []) if s.get(N.PHASE) in ("checkpoint", "eval")]
        out.append(RankStats(
            rank=rank, host=host, steps=sum(_last(s) for s in ss),
            step_time_s=sum(_last(s) for s in hs), step_count=sum(s.counts[-1] for s in hs if s.counts),
            phases=dict(ph), samples=max(len(s.points) for s in ss), first_t=first,
            last_t=max(s.points[-1][0] for s in ss), first_step_s=counted + sum(v or 0.0 for v in between),
            started=True))
    return sorted(out, key=lambda r: (int(r.rank) if r.rank.isdigit() else 1 << 30, r.rank, r.host))


def gpus_of(rec: Recording, start: float, end: float) -> list[GpuStats]:
    """gpu_summary: per (host, GPU UUID, index) means, peaks, throttle shares, ranks on it."""
    by = (N.HOST, N.HW_ID, N.GPU_INDEX)
    g = lambda spec: _group(rec.series(spec.name, start, end), by)   # noqa: E731
    util, sm, power, plimit = g(N.GPU_UTILIZATION), g(N.GPU_SM_ACTIVITY), g(N.GPU_POWER), g(N.GPU_POWER_LIMIT)
    temp, mem, mlimit, procs = g(N.GPU_TEMPERATURE), g(N.GPU_MEMORY_USAGE), g(N.GPU_MEMORY_LIMIT), g(N.GPU_PROCESS_MEMORY)
    clock = _group([s for s in rec.series(N.GPU_CLOCK.name, start, end) if s.get(N.CLOCK_DOMAIN) == "sm"], by)
    events = _group([s for s in rec.series(N.GPU_CLOCK_EVENT.name, start, end)
                     if s.get(N.CLOCK_REASON) in THROTTLE_REASONS], by)
    out = []
    keys = set(util) | set(sm) | set(mem)
    for key in sorted(keys, key=lambda k: (k[0], int(k[2]) if k[2].isdigit() else 1 << 30, k[1])):
        host, uuid, index = key
        throttle: dict[str, list[float]] = defaultdict(list)
        for s in events.get(key, []):
            throttle[s.get(N.CLOCK_REASON)].append(_avg(s))
        ranks = sorted({s.get(N.RANK) for s in procs.get(key, []) if s.get(N.RANK)},
                       key=lambda r: int(r) if r.isdigit() else 1 << 30)
        ms = mem.get(key, [])
        out.append(GpuStats(
            host=host, gpu=index, uuid=uuid,
            util=_agg((_avg(s) for s in util.get(key, [])), mean), sm=_agg((_avg(s) for s in sm.get(key, [])), mean),
            power_w=_agg((_avg(s) for s in power.get(key, [])), mean),
            power_limit_w=_agg((max(v for _, v in s.points) for s in plimit.get(key, [])), max),
            temp_c=_agg((_avg(s) for s in temp.get(key, [])), mean),
            temp_max_c=_agg((max(v for _, v in s.points) for s in temp.get(key, [])), max),
            clock_hz=_agg((_avg(s) for s in clock.get(key, [])), mean),
            clock_max_hz=_agg((max(v for _, v in s.points) for s in clock.get(key, [])), max),
            mem_used_b=_agg((max(v for _, v in s.points) for s in ms), max),
            mem_limit_b=_agg((max(v for _, v in s.points) for s in mlimit.get(key, [])), max),
            throttle={k: mean(v) for k, v in throttle.items()}, ranks=ranks,
            samples=max((len(s.points) for s in ms), default=0),
            first_t=min((s.points[0][0] for s in ms), default=None),
            last_t=max((s.points[-1][0] for s in ms), default=None)))
    return out


def nodes_of(rec: Recording, start: float, end: float) -> list[NodeStats]:
    """node_summary: per host CPU, memory, swap, NIC/IB errors and throughput against link speed, disk writes."""
    hosts: dict[str, dict[str, float | None]] = defaultdict(dict)

    def per_host(spec, keep=lambda s: True):
        return _group([s for s in rec.series(spec.name, start, end) if keep(s)], (N.HOST,))

    def by_dir_max_sum(ss: list[Series]) -> float | None:   # max over directions of the summed rates
        dirs: dict[str, float] = defaultdict(float)
        for s in ss:
            r = _rate(s)
            if r is not None:
                dirs[s.get(N.DIRECTION)] += r
        return max(dirs.values()) if dirs else None

    def limits(ss: list[Series], key: Callable[[Series], tuple]) -> float | None:
        best: dict[tuple, float] = {}
        for s in ss:
            best[key(s)] = max(best.get(key(s), -math.inf), max(v for _, v in s.points))
        return sum(best.values()) if best else None

    real = lambda s: not VIRTUAL.match(s.get(N.IFACE))   # noqa: E731
    for (h,), ss in per_host(N.CPU_UTILIZATION, lambda s: s.get(N.CPU_MODE) == "idle").items():
        hosts[h]["cpu_busy"] = 1 - mean(_avg(s) for s in ss)
    for (h,), ss in per_host(N.MEMORY_UTILIZATION).items():
        hosts[h]["mem_used"] = max(max(v for _, v in s.points) for s in ss)
    for (h,), ss in per_host(N.PAGING_USAGE, lambda s: s.get(N.PAGING_STATE) == "used").items():
        hosts[h]["swap_used"] = max(max(v for _, v in s.points) for s in ss)
    for (h,), ss in per_host(N.PAGING_OPERATIONS).items():
        hosts[h]["swap_rate"] = _agg((_rate(s) for s in ss), sum)
    for (h,), ss in per_host(N.NET_ERRORS).items():
        hosts[h]["nic_errors"] = sum(_last(s) for s in ss)   # delta(): started inside the window
    for (h,), ss in per_host(N.IB_ERRORS).items():
        hosts[h]["ib_errors"] = sum(_last(s) for s in ss)
    for (h,), ss in per_host(N.IB_IO).items():
        hosts[h]["ib_rate"] = by_dir_max_sum(ss)
    for (h,), ss in per_host(N.NET_LIMIT, lambda s: bool(s.get(N.IB_DEVICE))).items():
        hosts[h]["ib_limit"] = limits(ss, lambda s: (s.get(N.IB_DEVICE), s.get(N.IB_PORT)))
    for (h,), ss in per_host(N.NET_IO, real).items():
        hosts[h]["eth_rate"] = by_dir_max_sum(ss)
    for (h,), ss in per_host(N.NET_LIMIT, real).items():
        hosts[h]["eth_limit"] = limits(ss, lambda s: (s.get(N.IFACE),))
    for (h,), ss in per_host(N.DISK_IO, lambda s: s.get(N.DISK_DIRECTION) == "write").items():
        hosts[h]["disk_write"] = _agg((_rate(s) for s in ss), sum)
    out = []
    for h, v in sorted(hosts.items()):
        ib = v.get("ib_limit")
        kind = "infiniband" if ib else ("ethernet" if v.get("eth_limit") else "")
        out.append(NodeStats(
            host=h, cpu_busy=v.get("cpu_busy"), mem_used=v.get("mem_used"), swap_used_b=v.get("swap_used"),
            swap_pages_per_s=v.get("swap_rate"), nic_errors=v.get("nic_errors"), ib_errors=v.get("ib_errors"),
            link_Bps=v.get("ib_rate") if kind == "infiniband" else v.get("eth_rate"),
            link_limit_Bps=ib if kind == "infiniband" else v.get("eth_limit"), link_kind=kind,
            disk_write_Bps=v.get("disk_write")))
    return out


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
    util, sm = rec.series(N.GPU_UTILIZATION.name, start, end), rec.series(N.GPU_SM_ACTIVITY.name, start, end)
    if util:
        tl.series["util"] = _list(grid_avg(util, grid, smooth))
    if sm:
        tl.series["sm"] = _list(grid_avg(sm, grid, smooth))
    steps = rec.series(N.TRAIN_STEPS.name, start, end)
    if steps:
        tl.series["steps"] = _list(_nansum([grid_rate(s, grid, smooth) for s in steps], n))
    by_phase = _group([s for s in rec.series(N.TRAIN_PHASE_TIME.name, start, end)
                       if s.get(N.PHASE) in TIMELINE_PHASES], (N.PHASE,))
    for (phase,), ss in by_phase.items():
        cum = _list(_nansum([grid_last(s, grid) for s in ss], n))
        tl.series["phase_" + phase] = occupancy(cum, step, ranks)
    writes = [s for s in rec.series(N.DISK_IO.name, start, end) if s.get(N.DISK_DIRECTION) == "write"]
    if writes:
        tl.series["disk_write"] = _list(_nansum([grid_rate(s, grid, smooth) for s in writes], n))
    ib = _group(rec.series(N.IB_IO.name, start, end), (N.HOST,))
    if ib:
        per_node = [_nansum([grid_rate(s, grid, smooth) for s in ss], n) for ss in ib.values()]
        tl.series["ib"] = _list(_nanmax(per_node, n))
    return tl


def profile_of(rec: Recording) -> P.ProfileSummary | None:
    """The recorded profiles as the communication rule reads them (samples in nanoseconds)."""
    rows = [(list(reversed(stack)), value, labels, {}) for stack, value, labels, unit in rec.profile_stacks()]
    return P.from_samples(rows) if rows else None


def recorded_window(rec: Recording, *, require_steps: bool = True, with_profile: bool = True) -> Window:
    """The whole recording as a diagnosis window; DiagnoseError when there is nothing to diagnose."""
    span = rec.span()
    if span is None or span[1] <= span[0]:
        raise DiagnoseError(f"empty recording: no points in {', '.join(map(str, rec.dirs))}")
    start, end = span
    w = Window(job=rec.job, start=start, end=end)
    w.ranks, w.gpus, w.nodes = ranks_of(rec, start, end), gpus_of(rec, start, end), nodes_of(rec, start, end)
    if not (w.ranks or w.gpus or w.nodes):
        raise DiagnoseError(f"empty recording: no otel-gpu series in {', '.join(map(str, rec.dirs))}")
    if require_steps and not w.ranks:
        raise DiagnoseError("no step metrics in the recording (otelgpu.train.steps): the command ran no "
                            "training loop otel-gpu knows, or pass --gpu-only")
    w.interval_s = estimate_interval(w.ranks, w.gpus)
    w.step_s = resolution(end - start)
    w.timeline = timeline_of(rec, start, end, w.step_s, w.step_s + 2 * w.interval_s, max(1, len(w.ranks)))
    if with_profile:
        w.profile = profile_of(rec)
    return w
