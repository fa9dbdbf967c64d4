"""Energy per training step and per token, per GPU and per job, from NVML's energy counter (pure).

`hw.energy` is each GPU's energy in joules since the driver loaded. NVML's call costs milliseconds,
so the node agent reads it every ~10 s or more (sources/nvml_cadence.py) and repeats the last read in
between: a *read* here is the first export that carries a new value (up to one export interval after
NVML was asked). A GPU's energy over a window is the counter's increase between its first and last
read inside the window, a drop counted as a reset (a driver reload restarts the counter at zero: the
value after the drop is energy since the reload, as PromQL's `increase`). The work over the same
interval is each rank's step and token counter there, interpolated linearly between exports.

Groups: a GPU that lists the ranks' processes (the agent's per-process memory series) is one group
with those ranks; on a host where no GPU lists a rank (containers hiding PIDs, fake GPUs), all the
GPUs the agent read on that host and all the host's ranks are one group. Per group:
J/step = sum over its GPUs of energy / the ranks' mean steps over that GPU's interval (each rank takes
every step), J/token = sum over its GPUs of energy / the ranks' summed tokens over that interval.
The job: J/step summed over groups (every GPU's energy per job step); J/token = all energy / all tokens.
Where a number cannot be had, its reason says why ("not checked: ...").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

Points = list[tuple[float, float]]   # (unix s, value), time order
NO_GPU = "not checked: no GPU readings (no node agent ran, or no NVIDIA GPU)"
MIG = "not checked: MIG instance (NVML has no energy counter per MIG slice)"
NO_COUNTER = "not checked: NVML reports no energy counter on this GPU (pre-Volta, or not supported)"
FEW_READS = ("not checked: under two energy reads during training (NVML's energy counter is read every "
             "~10 s or more, as its cost allows: a shorter run or window has no interval)")
NO_STEPS = "not checked: no training steps recorded"
NO_TOKENS = "not checked: no tokens counted on {ranks} (a plain loop passes step(tokens=...), or batches with input_ids)"


@dataclass(frozen=True)
class Gpu:
    """One GPU: `energy` the counter's points (J); `mig`: a MIG instance."""
    host: str
    uuid: str
    index: str
    energy: Points = field(default_factory=list)
    mig: bool = False


@dataclass(frozen=True)
class Rank:
    """One rank's cumulative step and token counters (empty: not exported)."""
    host: str
    rank: str
    steps: Points = field(default_factory=list)
    tokens: Points = field(default_factory=list)


@dataclass(frozen=True)
class Energy:
    """One group's (or the job's) energy and work over its interval: joules, seconds (the GPUs'
    read intervals, summed over GPUs), steps (the ranks' mean), tokens (summed); J/step and J/token,
    or the reason each is missing."""
    label: str
    gpus: tuple[str, ...]
    ranks: tuple[str, ...]
    joules: float | None = None
    seconds: float | None = None
    steps: float | None = None
    tokens: float | None = None
    j_per_step: float | None = None
    j_per_token: float | None = None
    why_step: str = ""
    why_token: str = ""
    resets: int = 0
    basis: str = ""      # how the GPUs and ranks were matched

    def as_dict(self) -> dict:
        return dict(self.__dict__, gpus=list(self.gpus), ranks=list(self.ranks))


def reads(points: Points) -> Points:
    """The points where the value changed (the first export of each read), the first point kept."""
    out: Points = []
    for t, v in points:
        if not math.isfinite(v):
            continue
        if not out or v != out[-1][1]:
            out.append((t, v))
    return out


def increase(values: list[float]) -> tuple[float, int]:
    """(increase, resets) of a cumulative counter's successive values: a drop is a reset from zero."""
    total, resets = 0.0, 0
    for a, b in zip(values, values[1:]):
        if b >= a:
            total += b - a
        else:
            total += b
            resets += 1
    return total, resets


def at(points: Points, t: float) -> float | None:
    """A cumulative counter's value at `t`, linear between its points; None outside them. A drop
    between two points (a restarted process) makes the later value count from zero."""
    if not points or t < points[0][0] or t > points[-1][0]:
        return None
    return float(np.interp(t, *_cumulative(points)))


def _cumulative(points: Points) -> tuple[np.ndarray, np.ndarray]:
    """(times, the counter with every reset undone): a monotonic total to interpolate."""
    times, values = np.asarray(points, dtype=float).reshape(-1, 2).T
    step = np.diff(values)
    return times, values[0] + np.concatenate(([0.0], np.cumsum(np.where(step >= 0, step, values[1:]))))


def _span(series: list[Points]) -> tuple[float, float] | None:
    """Where every series has points: (latest first time, earliest last time); None when empty."""
    if not series or any(not s for s in series):
        return None
    lo, hi = max(s[0][0] for s in series), min(s[-1][0] for s in series)
    return (lo, hi) if hi > lo else None


def _delta(counter: tuple[np.ndarray, np.ndarray], a: float, b: float) -> float:
    """A counter's growth from `a` to `b` (both inside its points), from `_cumulative`."""
    grown = np.interp([a, b], *counter)
    return max(0.0, float(grown[1] - grown[0]))


def _group(label: str, gpus: list[Gpu], ranks: list[Rank], lo: float | None, hi: float | None,
           basis: str = "") -> Energy:
    names = tuple(sorted({g.index for g in gpus}, key=_num)), tuple(sorted({r.rank for r in ranks}, key=_num))
    base = dict(label=label, gpus=names[0], ranks=names[1], basis=basis)
    no_energy = [g for g in gpus if not g.energy]
    if no_energy:
        why = MIG if any(g.mig for g in no_energy) else NO_COUNTER
        return Energy(**base, why_step=why, why_token=why)
    if not ranks or any(not r.steps for r in ranks):
        return Energy(**base, why_step=NO_STEPS, why_token=NO_STEPS)
    untokened = [r.rank for r in ranks if not r.tokens]
    span = _span([r.steps for r in ranks] + [r.tokens for r in ranks if r.tokens])
    if span is not None:
        span = (max(span[0], lo if lo is not None else -math.inf), min(span[1], hi if hi is not None else math.inf))
    steps_of = [_cumulative(r.steps) for r in ranks]
    tokens_of = [_cumulative(r.tokens) for r in ranks if r.tokens]
    joules = seconds = per_step = per_token = tokens_sum = steps_sum = 0.0
    resets = 0
    for g in gpus:
        rs = [p for p in reads(g.energy) if span is not None and span[0] <= p[0] <= span[1]]
        if len(rs) < 2:
            return Energy(**base, why_step=FEW_READS, why_token=FEW_READS)
        e, n = increase([v for _, v in rs])
        a, b = rs[0][0], rs[-1][0]
        steps = sum(_delta(c, a, b) for c in steps_of) / len(ranks)
        tokens = sum(_delta(c, a, b) for c in tokens_of)
        joules, seconds, resets = joules + e, seconds + (b - a), resets + n
        steps_sum, tokens_sum = steps_sum + steps, tokens_sum + tokens
        per_step = per_step + e / steps if steps > 0 and per_step is not None else None
        per_token = per_token + e / tokens if tokens > 0 and per_token is not None else None
    why_token = (NO_TOKENS.format(ranks=_ranks_text(untokened)) if untokened
                 else "" if per_token is not None else "not checked: no token counted inside the interval")
    return Energy(**base, joules=joules, seconds=seconds, steps=steps_sum / len(gpus), tokens=tokens_sum / len(gpus),
                  j_per_step=per_step, j_per_token=None if untokened else per_token,
                  why_step="" if per_step is not None else "not checked: no step counted inside the interval",
                  why_token=why_token, resets=resets)


def _ranks_text(ranks: list[str]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(sorted(ranks, key=_num))


def _num(text: str):
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def per_gpu(gpus: list[Gpu], ranks: list[Rank], on_gpu: dict[tuple[str, str], set[str]],
            lo: float | None = None, hi: float | None = None) -> tuple[list[Energy], Energy]:
    """(one row per group, the job's row) over [lo, hi] (unix s; None: the whole series).
    `on_gpu`: (host, GPU UUID) -> the ranks whose processes that GPU lists."""
    rows: list[Energy] = []
    hosts = sorted({g.host for g in gpus})
    multi = len(hosts) > 1
    for host in hosts:
        mine = sorted((g for g in gpus if g.host == host), key=lambda g: _num(g.index))
        host_ranks = [r for r in ranks if r.host == host]
        joined = [g for g in mine if on_gpu.get((host, g.uuid))]
        pre = f"{host} " if multi else ""
        if joined:
            for g in joined:
                want = on_gpu[(host, g.uuid)]
                rows.append(_group(f"{pre}GPU {g.index}", [g], [r for r in host_ranks if r.rank in want], lo, hi,
                                   "the ranks whose processes this GPU lists"))
        else:
            rows.append(_group(f"{pre}GPU {', '.join(g.index for g in mine)}", mine, host_ranks, lo, hi,
                               "no GPU lists a rank's process: the host's GPUs and ranks together"))
    return rows, job_row(rows, bool(gpus))


def job_row(rows: list[Energy], any_gpu: bool) -> Energy:
    """The job: J/step summed over groups, J/token all energy over all tokens; a group without a number
    makes the job's number not checked, with that group's reason."""
    gpus = tuple(g for r in rows for g in r.gpus)
    ranks = tuple(sorted({k for r in rows for k in r.ranks}, key=_num))
    if not any_gpu:
        return Energy("job", gpus, ranks, why_step=NO_GPU, why_token=NO_GPU)
    step_missing = next((r for r in rows if r.j_per_step is None), None)
    token_missing = next((r for r in rows if r.j_per_token is None), None)
    measured = all(r.joules is not None for r in rows)
    joules = sum(r.joules for r in rows) if measured else None
    tokens = sum(r.tokens or 0.0 for r in rows) if measured else None
    return Energy(
        "job", gpus, ranks, joules=joules, seconds=sum(r.seconds for r in rows) if measured else None,
        steps=min((r.steps for r in rows if r.steps is not None), default=None), tokens=tokens,
        j_per_step=None if step_missing else sum(r.j_per_step for r in rows),
        j_per_token=None if token_missing or not tokens else joules / tokens,
        why_step=_why(step_missing, "step"), why_token=_why(token_missing, "token"),
        resets=sum(r.resets for r in rows))


def _why(row: Energy | None, what: str) -> str:
    if row is None:
        return ""
    return row.why_step if what == "step" else row.why_token


def fmt(value: float | None, unit: str) -> str:
    """'412 J/step', '0.0312 J/token' (3 significant digits)."""
    return "-" if value is None else f"{value:.3g} {unit}"
