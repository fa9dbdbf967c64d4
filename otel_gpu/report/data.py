"""What a report shows, computed from a recording (pure over a `Recording`): time series on one
grid per plot, flame graph trees per rank and phase, and the run's summary numbers.

Every plot is `{"id", "title", "unit", "x": [unix s], "series": [{"label", "values", "dash"}]}`
with None where a series has no value; counters become rates over the grid step.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict

import numpy as np

from .. import names as N
from ..record.reader import Recording, Series
from ..record.window import VIRTUAL
from ..diagnose.gpu_waits import REASON_TEXT

MAX_POINTS = 600          # grid points per plot over the whole run
MIN_STEP_S = 0.25         # finest grid step: counters are linear between their points, so rates stay exact
PHASE_ORDER = ("data_wait", "forward", "backward", "optimizer", "checkpoint", "eval")
COLLECTIVE_TITLES = {   # by the bases present: host-blocked (gloo) and GPU-timed (NCCL) seconds are never added
    frozenset({"host"}): "Time blocked in collectives per rank (share of wall time; host clock)",
    frozenset({"gpu"}): "Time in NCCL collectives per rank (share of wall time; GPU-timed, waiting for the last rank "
                        "included, may overlap compute)",
    frozenset(): "Time in collectives per rank (share of wall time; host-blocked solid, GPU-timed dashed)",
}


def grid_of(start: float, end: float) -> np.ndarray:
    """Times (unix s) every `step` from start to end: at most MAX_POINTS, at least MIN_STEP_S apart."""
    step = max(MIN_STEP_S, (end - start) / MAX_POINTS)
    return start + step * np.arange(int((end - start) / step) + 1)


def _interp(s: Series, grid: np.ndarray, values=None) -> np.ndarray:
    a = np.asarray(s.points, dtype=float)
    v = a[:, 1] if values is None else np.asarray(values, dtype=float)
    return np.interp(grid, a[:, 0], v, left=np.nan, right=np.nan)


def _delta(x: np.ndarray) -> np.ndarray:
    return np.concatenate([[np.nan], np.diff(x)])


def _rate(s: Series, grid: np.ndarray) -> np.ndarray:
    step = grid[1] - grid[0] if len(grid) > 1 else 1.0
    return np.maximum(_delta(_interp(s, grid)), 0) / step


def _sum(arrays: list[np.ndarray], n: int) -> np.ndarray:
    if not arrays:
        return np.full(n, np.nan)
    a = np.vstack(arrays)
    return np.where(np.all(np.isnan(a), axis=0), np.nan, np.nansum(a, axis=0))


def _values(a: np.ndarray, digits: int = 4) -> list[float | None]:
    return [None if math.isnan(x) else float(f"{x:.{digits}g}") for x in a]


def _num_key(text: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _by(series: list[Series], *keys: str) -> dict[tuple, list[Series]]:
    out: dict[tuple, list[Series]] = defaultdict(list)
    for s in series:
        out[tuple(s.get(k) for k in keys)].append(s)
    return dict(sorted(out.items(), key=lambda kv: [_num_key(x) for x in kv[0]]))


def _plot(pid: str, title: str, unit: str, grid: np.ndarray, series: list[tuple[str, np.ndarray, bool]],
          stacked: bool = False) -> dict:
    return {"id": pid, "title": title, "unit": unit, "stacked": stacked, "x": [round(float(t), 3) for t in grid],
            "series": [{"label": label, "values": _values(v), "dash": dash} for label, v, dash in series]}


def rank_label(host: str, rank: str, hosts: int) -> str:
    return f"rank {rank}" if hosts <= 1 else f"{host} rank {rank}"


def _rows(arrays: list[np.ndarray], fn) -> np.ndarray:
    """`fn` (np.nanmean, np.nanmax) across series at each grid point; NaN where none has a value."""
    a = np.vstack(arrays)
    out = np.full(a.shape[1], np.nan)
    has = ~np.all(np.isnan(a), axis=0)
    out[has] = fn(a[:, has], axis=0)
    return out


class _Bucketed:
    """The recording read with one point per series and grid step (what a plot can show)."""

    def __init__(self, rec: Recording, start: float, end: float, step: float):
        self.rec, self.start, self.end, self.step = rec, start, end, step

    def series(self, metric: str) -> list[Series]:
        return self.rec.series(metric, self.start, self.end, step=self.step)

    def metrics(self) -> list[str]:
        return self.rec.metrics()


def plots(rec: Recording, start: float, end: float) -> list[dict]:
    grid = grid_of(start, end)
    n, step = len(grid), (grid[1] - grid[0] if len(grid) > 1 else 1.0)
    rec = _Bucketed(rec, start, end, step) if step > MIN_STEP_S else rec
    hosts = len({s.get(N.HOST) for s in rec.series(N.TRAIN_STEPS.name)}) or 1
    out = []

    gpu = []
    util, sm = _by(rec.series(N.GPU_UTILIZATION.name), N.HOST, N.GPU_INDEX), _by(rec.series(N.GPU_SM_ACTIVITY.name), N.HOST, N.GPU_INDEX)
    for key in sorted(set(util) | set(sm), key=lambda k: [_num_key(x) for x in k]):
        name = f"gpu{key[1]}" if len({k[0] for k in util} | {k[0] for k in sm}) <= 1 else f"{key[0]}/gpu{key[1]}"
        for what, table, dash in (("util", util, False), ("SM active", sm, True)):
            if key in table:
                gpu.append((f"{name} {what}", _rows([_interp(s, grid) for s in table[key]], np.nanmean), dash))
    out.append(_plot("gpu", "GPU utilization (solid) and SM activity (dashed), per GPU", "share", grid, gpu))

    steps = []
    for (host, rank), hs in _by(rec.series(N.TRAIN_STEP_DURATION.name), N.HOST, N.RANK).items():
        tot = _sum([_delta(_interp(s, grid)) for s in hs], n)
        cnt = _sum([_delta(_interp(s, grid, s.counts)) for s in hs if len(s.counts) == len(s.points)], n)
        with np.errstate(invalid="ignore", divide="ignore"):
            steps.append((rank_label(host, rank, hosts), np.where(cnt > 0.5, tot / cnt, np.nan), False))
    out.append(_plot("step_time", "Step time per rank (mean over each interval)", "s", grid, steps))

    by_phase = _by(rec.series(N.TRAIN_PHASE_TIME.name), N.PHASE)
    nranks = max(1, len(_by(rec.series(N.TRAIN_STEPS.name), N.HOST, N.RANK)))
    names = [p for p in PHASE_ORDER if (p,) in by_phase] + sorted(p for (p,) in by_phase if p not in PHASE_ORDER)
    shares = [(p, np.clip(_sum([_rate(s, grid) for s in by_phase[(p,)]], n) / nranks, 0, 1)) for p in names]
    if shares:
        phased = _sum([v for _, v in shares], n)
        shares.append(("unphased", np.clip(1 - phased, 0, 1)))
    stack, acc = [], np.zeros(n)
    for p, v in shares:
        acc = acc + np.nan_to_num(v)
        stack.append((p, np.where(np.isnan(v), np.nan, acc), False))
    out.append(_plot("phases", "Phase shares of wall time, all ranks (stacked)", "share", grid, stack, stacked=True))

    coll = []
    by_basis = _by(rec.series(N.TRAIN_COLLECTIVE_TIME.name), N.HOST, N.RANK, N.COLLECTIVE_BASIS)
    bases = {b or "host" for _, _, b in by_basis}
    for (host, rank, basis), ss in sorted(by_basis.items(), key=lambda kv: [_num_key(x) for x in kv[0]]):
        label = rank_label(host, rank, hosts) + (" GPU-timed" if (basis or "host") == "gpu" and len(bases) > 1 else "")
        coll.append((label, _sum([_rate(s, grid) for s in ss], n), (basis or "host") == "gpu" and len(bases) > 1))
    plot = _plot("collective", COLLECTIVE_TITLES.get(frozenset(bases), COLLECTIVE_TITLES[frozenset()]), "share", grid, coll)
    if not coll:
        plot["empty"] = collective_empty_reason(rec)
    out.append(plot)

    net = []
    multi = len({s.get(N.HOST) for s in rec.series(N.NET_IO.name)}) > 1
    for (host,), ss in _by([s for s in rec.series(N.NET_IO.name) if not VIRTUAL.match(s.get(N.IFACE))], N.HOST).items():
        for d in ("receive", "transmit"):
            net.append((f"{host + ' ' if multi else ''}ethernet {d}", _sum([_rate(s, grid) for s in ss if s.get(N.DIRECTION) == d], n), False))
    for (host,), ss in _by(rec.series(N.IB_IO.name), N.HOST).items():
        for d in ("receive", "transmit"):
            net.append((f"{host + ' ' if multi else ''}InfiniBand {d}", _sum([_rate(s, grid) for s in ss if s.get(N.DIRECTION) == d], n), False))
    for (host,), ss in _by(rec.series(N.NET_LIMIT.name), N.HOST).items():
        ib = [s for s in ss if s.get(N.IB_DEVICE)]
        eth = [s for s in ss if not s.get(N.IB_DEVICE) and not VIRTUAL.match(s.get(N.IFACE))]
        for what, group in (("InfiniBand", ib), ("ethernet", eth)):
            if group:
                net.append((f"{host + ' ' if multi else ''}{what} link speed", _sum([_interp(s, grid) for s in group], n), True))
    out.append(_plot("network", "Network and InfiniBand throughput against link speed (dashed)", "B/s", grid, net))

    disk = []
    for (host, d), ss in _by(rec.series(N.DISK_IO.name), N.HOST, N.DISK_DIRECTION).items():
        disk.append((f"{host + ' ' if multi else ''}{d}", _sum([_rate(s, grid) for s in ss], n), False))
    out.append(_plot("disk", "Disk read / write", "B/s", grid, disk))

    cpu = []
    for (host,), ss in _by([s for s in rec.series(N.CPU_UTILIZATION.name) if s.get(N.CPU_MODE) == "idle"], N.HOST).items():
        cpu.append((f"{host + ' ' if multi else ''}CPU busy", 1 - _rows([_interp(s, grid) for s in ss], np.nanmean), False))
    for (host,), ss in _by(rec.series(N.MEMORY_UTILIZATION.name), N.HOST).items():
        cpu.append((f"{host + ' ' if multi else ''}memory used", _rows([_interp(s, grid) for s in ss], np.nanmax), True))
    out.append(_plot("cpu_mem", "CPU busy and memory used, per node", "share", grid, cpu))
    return out


def collective_empty_reason(rec) -> str:
    """Why the collective plot has no line: the ranks' own reasons, else what it takes to get one."""
    reasons = sorted({s.get(N.UNMEASURED_REASON) for s in rec.series(N.TRAIN_COLLECTIVE_UNMEASURED.name)})
    if reasons:
        return "not measured: " + "; ".join(REASON_TEXT.get(r, r) for r in reasons)
    if not rec.series(N.TRAIN_STEPS.name):
        return "no training steps recorded, so no collective time (it is counted inside steps)"
    return ("no collective recorded inside the steps: a single process without torch.distributed, or a "
            "communication library otel-gpu does not time (wrap it in otel_gpu.training.collective)")
