"""What a report's plots show, computed from a recording (pure over a `Recording`): every series on
one cell grid per report, each value over the interval it describes (report/align.py).

Every plot is `{"id", "title", "unit", "stacked", "x": [cell edges, unix s], "series": [{"label",
"values", "dash", "group"}], "axis", "bands"}`: `values[i]` is the mean over (x[i], x[i+1]] (the last
repeats the one before, so a step drawing reaches the axis' end), None where nothing was recorded;
counters become rates. `axis` says where time 0 is (the first training step) and how much start-up
before it is left out; `bands` are the checkpoint saves, shaded on every plot. A plot with no data
carries `empty`: why. A stacked plot's values are each series' own (a phase's share, not the sum
below it): the page stacks them to draw them and shows each one's own value on hover.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict

import numpy as np

from .. import names as N
from ..record.reader import Recording, Series
from ..record.window import VIRTUAL, save_ranges_of
from ..diagnose.gpu_waits import REASON_TEXT
from . import align as A

PHASE_ORDER = ("data_wait", "forward", "backward", "optimizer", "checkpoint", "eval")
UNPHASED = "unphased"
COLLECTIVE_WAIT = "collective wait"   # the phases plot's band of seconds blocked in collectives (host clock)
COLLECTIVE_TITLES = {   # by the bases present: host-blocked (gloo) and GPU-timed (NCCL) seconds are never added
    frozenset({"host"}): "Time blocked in collectives per rank (share of wall time; host clock)",
    frozenset({"gpu"}): "Time in NCCL collectives per rank (share of wall time; GPU-timed, waiting for the last rank "
                        "included, may overlap compute)",
    frozenset({"host", "gpu"}): "Time in collectives per rank (share of wall time; host-blocked solid, GPU-timed dashed)",
    frozenset(): "Time in collectives per rank (share of wall time)",
}
GAUGE_KINDS = ("gauge", "updowncounter")


def _sum(arrays: list[np.ndarray], n: int) -> np.ndarray:
    if not arrays:
        return np.full(n, np.nan)
    a = np.vstack(arrays)
    return np.where(np.all(np.isnan(a), axis=0), np.nan, np.nansum(a, axis=0))


def _rows(arrays: list[np.ndarray], fn) -> np.ndarray:
    """`fn` (np.nanmean, np.nanmax) across series at each cell; NaN where none has a value."""
    a = np.vstack(arrays)
    out = np.full(a.shape[1], np.nan)
    has = ~np.all(np.isnan(a), axis=0)
    out[has] = fn(a[:, has], axis=0)
    return out


def _values(a: np.ndarray, digits: int = 4) -> list[float | None]:
    out = [None if math.isnan(x) else float(f"{x:.{digits}g}") for x in a]
    return out + out[-1:]   # the last cell's value again at the axis' end


def _num_key(text: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _by(series: list[Series], *keys: str) -> dict[tuple, list[Series]]:
    out: dict[tuple, list[Series]] = defaultdict(list)
    for s in series:
        out[tuple(s.get(k) for k in keys)].append(s)
    return dict(sorted(out.items(), key=lambda kv: [_num_key(x) for x in kv[0]]))


def rank_label(host: str, rank: str, hosts: int) -> str:
    return f"rank {rank}" if hosts <= 1 else f"{host} rank {rank}"


def _tv(s: Series) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(s.points, dtype=float)
    return a[:, 0], a[:, 1]


class Cells:
    """The report's time cells and the recording read onto them (one point per half cell on long runs)."""

    def __init__(self, rec: Recording, t0: float, end: float):
        self.rec, self.t0, self.end = rec, t0, end
        self.edges = A.cell_edges(t0, max(end, t0 + A.MIN_CELL_S))
        self.n = len(self.edges) - 1
        width = self.edges[1] - self.edges[0]
        self._step = width / 2 if width > A.MIN_CELL_S * 1.01 else None

    def series(self, metric: str) -> list[Series]:
        """Every series of `metric`, with one interval of points before time 0 (the one that ends in it)."""
        return self.rec.series(metric, self.t0 - 30.0, self.end, step=self._step)

    def gauge(self, s: Series) -> np.ndarray:
        return A.on_cells(A.gauge_segments(*_tv(s)), self.edges)

    def rate(self, s: Series, zero_at: float | None = None, max_rate: float | None = None) -> np.ndarray:
        return A.on_cells(A.counter_segments(*_tv(s), zero_at=zero_at, max_rate=max_rate), self.edges)

    def value(self, s: Series) -> np.ndarray:
        """A gauge's mean or a counter's rate per cell, by the series' kind."""
        return self.gauge(s) if s.kind in GAUGE_KINDS else self.rate(s)


def plot(pid: str, title: str, unit: str, cells: Cells, series: list[tuple], stacked: bool = False,
         empty: str = "") -> dict:
    """A plot; `series` are (label, values per cell, dashed, group) with group optional (colour key)."""
    out = {"id": pid, "title": title, "unit": unit, "stacked": stacked,
           "x": [round(float(t), 3) for t in cells.edges],
           "series": [{"label": s[0], "values": _values(s[1]), "dash": s[2], "group": s[3] if len(s) > 3 else s[0]}
                      for s in series]}
    if empty and not any(np.any(~np.isnan(s[1])) for s in series):
        out["empty"] = empty
    return out


def first_step(rec: Recording, start: float, end: float) -> float | None:
    """When the first training step began (unix s), over all ranks (align.first_step_start on each
    rank's step-time histogram); else the step counter's first export."""
    step = max(end - start, 1.0) / 2000   # one point per step-long bucket: still (export, sum) pairs
    starts = [A.first_step_start(*_tv(s)) for s in rec.series(N.TRAIN_STEP_DURATION.name, start, end, step=step)]
    starts = [x for x in starts if x is not None]
    if not starts:
        starts = [st.first_t for _, st in rec.summaries(N.TRAIN_STEPS.name)]
    return min(starts) if starts else None


def save_bands(rec: Recording, start: float, end: float) -> list[dict]:
    """Checkpoint saves of any rank (start, end unix s), overlapping ones merged, for shading."""
    ranges = sorted(r for rs in save_ranges_of(rec, start, end).values() for r in rs)
    merged: list[list[float]] = []
    for a, b in ranges:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [{"from": round(a, 3), "to": round(b, 3), "label": "checkpoint save"} for a, b in merged]


def plots(rec: Recording, start: float, end: float) -> list[dict]:
    """Every plot of the report over [first step, end] (the recording's start when no step was recorded)."""
    from .gpu_plots import gpu_plots   # GPU panels live beside this module; they use its helpers
    t_first = first_step(rec, start, end)
    t0 = t_first if t_first is not None and start <= t_first < end else start
    cells = Cells(rec, t0, end)
    axis = {"t0": round(t0, 3), "end": round(end, 3), "startup_s": round(t0 - start, 3),
            "basis": "first step" if t0 != start or t_first is not None else "recording start"}
    bands = save_bands(rec, start, end)
    steps = cells.series(N.TRAIN_STEPS.name)   # read once: hosts and ranks for the labels and shares
    hosts = len({s.get(N.HOST) for s in steps}) or 1
    out = gpu_plots(cells) + training_plots(cells, hosts, steps) + node_plots(cells)
    for p in out:
        p["axis"], p["bands"] = axis, bands
    return out


def _rank_times(cells: Cells, *groups: list[Series]) -> dict[tuple, np.ndarray]:
    """(host, rank) -> the times its training metrics were exported (all share one reader)."""
    times: dict[tuple, set] = defaultdict(set)
    for ss in groups:
        for s in ss:
            times[(s.get(N.HOST), s.get(N.RANK))].update(t for t, _ in s.points)
    return {k: np.asarray(sorted(v)) for k, v in times.items()}


def _zero_at(s: Series, times: dict[tuple, np.ndarray]) -> float:
    """When a training counter was still zero: its rank's export before the counter's first point
    (a training counter is exported from its first non-zero value on), else one interval before it."""
    t = times.get((s.get(N.HOST), s.get(N.RANK)), np.empty(0))
    first = s.points[0][0]
    before = t[t < first - 1e-6]
    return float(before[-1]) if len(before) else first - A.typical_interval(t)


def training_plots(cells: Cells, hosts: int, step_series: list[Series]) -> list[dict]:
    n, out = cells.n, []
    hist, phase_series = cells.series(N.TRAIN_STEP_DURATION.name), cells.series(N.TRAIN_PHASE_TIME.name)
    coll_series = cells.series(N.TRAIN_COLLECTIVE_TIME.name)
    times = _rank_times(cells, hist, phase_series, coll_series)

    steps = []
    for (host, rank), hs in _by(hist, N.HOST, N.RANK).items():
        per = [A.on_cells(A.step_segments(*_tv(s), s.counts), cells.edges) for s in hs if len(s.counts) == len(s.points)]
        steps.append((rank_label(host, rank, hosts), _rows(per, np.nanmean) if per else np.full(n, np.nan), False))
    out.append(plot("step_time", "Step time per rank (each export's steps drawn over the time they ran)", "s",
                    cells, steps, empty="no training steps recorded"))

    by_phase = _by(phase_series, N.PHASE)
    nranks = max(1, len(_by(step_series, N.HOST, N.RANK)))
    names = [p for p in PHASE_ORDER if (p,) in by_phase] + sorted(p for (p,) in by_phase if p not in PHASE_ORDER)
    shares = [(p, np.clip(_sum([cells.rate(s, _zero_at(s, times), max_rate=1.0) for s in by_phase[(p,)]], n)
                          / nranks, 0, 1)) for p in names]
    if shares:
        # a phase's seconds are its own time: the seconds a rank blocks in a collective inside it are
        # counted apart (host basis); GPU-timed NCCL time overlaps compute and is no band of its own
        waits = [s for s in coll_series if (s.get(N.COLLECTIVE_BASIS) or "host") == "host"]
        if waits:
            shares.append((COLLECTIVE_WAIT, np.clip(_sum([cells.rate(s, _zero_at(s, times), max_rate=1.0)
                                                          for s in waits], n) / nranks, 0, 1)))
        shares.append((UNPHASED, np.clip(1 - _sum([v for _, v in shares], n), 0, 1)))
    out.append(plot("phases", "Phase shares of wall time, all ranks (stacked)", "share", cells,
                    [(p, v, False) for p, v in shares], stacked=True, empty="no phase recorded"))

    coll = []
    by_basis = _by(coll_series, N.HOST, N.RANK, N.COLLECTIVE_BASIS)
    bases = {b or "host" for _, _, b in by_basis}
    for (host, rank, basis), ss in by_basis.items():
        gpu = (basis or "host") == "gpu" and len(bases) > 1
        label = rank_label(host, rank, hosts) + (" GPU-timed" if gpu else "")
        coll.append((label, _sum([cells.rate(s, _zero_at(s, times)) for s in ss], n), gpu, rank_label(host, rank, hosts)))
    p = plot("collective", COLLECTIVE_TITLES.get(frozenset(bases), COLLECTIVE_TITLES[frozenset({"host", "gpu"})]),
             "share", cells, coll)
    if not coll:
        p["empty"] = collective_empty_reason(cells.rec, has_steps=bool(step_series))
    out.append(p)
    return out


def node_plots(cells: Cells) -> list[dict]:
    n, out = cells.n, []
    net, net_io = [], cells.series(N.NET_IO.name)
    multi = len({s.get(N.HOST) for s in net_io}) > 1
    pre = lambda host: f"{host} " if multi else ""   # noqa: E731
    for (host,), ss in _by([s for s in net_io if not VIRTUAL.match(s.get(N.IFACE))], N.HOST).items():
        for d in ("receive", "transmit"):
            net.append((f"{pre(host)}ethernet {d}", _sum([cells.rate(s) for s in ss if s.get(N.DIRECTION) == d], n), False))
    for (host,), ss in _by(cells.series(N.IB_IO.name), N.HOST).items():
        for d in ("receive", "transmit"):
            net.append((f"{pre(host)}InfiniBand {d}", _sum([cells.rate(s) for s in ss if s.get(N.DIRECTION) == d], n), False))
    for (host,), ss in _by(cells.series(N.NET_LIMIT.name), N.HOST).items():
        ib = [s for s in ss if s.get(N.IB_DEVICE)]
        eth = [s for s in ss if not s.get(N.IB_DEVICE) and not VIRTUAL.match(s.get(N.IFACE))]
        for what, group in (("InfiniBand", ib), ("ethernet", eth)):
            if group:
                net.append((f"{pre(host)}{what} link speed", _sum([cells.gauge(s) for s in group], n), True))
    out.append(plot("network", "Network and InfiniBand throughput against link speed (dashed)", "B/s", cells, net,
                    empty="no network interface recorded (no node agent ran)"))

    disk = []
    for (host, d), ss in _by(cells.series(N.DISK_IO.name), N.HOST, N.DISK_DIRECTION).items():
        disk.append((f"{pre(host)}{d}", _sum([cells.rate(s) for s in ss], n), False))
    out.append(plot("disk", "Disk read / write", "B/s", cells, disk, empty="no disk recorded (no node agent ran)"))

    cpu = []
    for (host,), ss in _by([s for s in cells.series(N.CPU_UTILIZATION.name) if s.get(N.CPU_MODE) == "idle"], N.HOST).items():
        cpu.append((f"{pre(host)}CPU busy", 1 - _rows([cells.gauge(s) for s in ss], np.nanmean), False))
    for (host,), ss in _by(cells.series(N.MEMORY_UTILIZATION.name), N.HOST).items():
        cpu.append((f"{pre(host)}memory used", _rows([cells.gauge(s) for s in ss], np.nanmax), True))
    out.append(plot("cpu_mem", "CPU busy and memory used, per node", "share", cells, cpu,
                    empty="no CPU or memory reading recorded (no node agent ran)"))
    return out


def collective_empty_reason(rec, has_steps: bool) -> str:
    """Why the collective plot has no line: the ranks' own reasons, else what it takes to get one."""
    reasons = sorted({s.get(N.UNMEASURED_REASON) for s in rec.series(N.TRAIN_COLLECTIVE_UNMEASURED.name)})
    if reasons:
        return "not measured: " + "; ".join(REASON_TEXT.get(r, r) for r in reasons)
    if not has_steps:
        return "no training steps recorded, so no collective time (it is counted inside steps)"
    return ("no collective recorded inside the steps: a single process without torch.distributed, or a "
            "communication library otel-gpu does not time (wrap it in otel_gpu.training.collective)")
