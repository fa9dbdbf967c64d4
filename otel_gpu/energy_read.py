"""Energy per step and per token (energy.py) read from a recording or from Prometheus: the same raw
points both ways, so both give the same numbers over the same window.

From Prometheus, each metric is one instant query of a range selector at the window's end (raw
samples, as the tuner reads its step histogram); the counters are read from `lookback_s` before the
window so a rank's value at the window's start can be interpolated.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

from . import energy as EN
from . import names as N

PROCESS_LOOKBACK_S = 60.0   # a GPU's process list: seen up to this long before the window counts


def _rank_key(get: Callable[[str], str]) -> tuple[str, str]:
    return get(N.HOST), get(N.RANK)


def _build(gpu_series, energy_series, proc_series, step_series, token_series) -> tuple:
    """(gpus, ranks, on_gpu) from series given as (getter, points) pairs."""
    energy: dict[tuple, list] = defaultdict(list)   # a GPU's series split where its labels change (a new owner)
    for get, pts in energy_series:
        energy[(get(N.HOST), get(N.HW_ID))] += pts
    seen: dict[tuple, tuple] = {}
    for get, _ in [*gpu_series, *energy_series]:
        key = (get(N.HOST), get(N.HW_ID))
        seen.setdefault(key, (get(N.GPU_INDEX), bool(get(N.MIG_PROFILE) or get(N.HW_PARENT))))
    gpus = [EN.Gpu(host, uuid, index, sorted(dict(energy.get((host, uuid), [])).items()), mig)
            for (host, uuid), (index, mig) in seen.items()]
    on_gpu: dict[tuple[str, str], set[str]] = defaultdict(set)
    for get, _ in proc_series:
        if get(N.RANK):
            on_gpu[(get(N.HOST), get(N.HW_ID))].add(get(N.RANK))
    steps: dict[tuple, list] = defaultdict(list)
    tokens: dict[tuple, list] = defaultdict(list)
    for into, series in ((steps, step_series), (tokens, token_series)):
        for get, pts in series:
            into[_rank_key(get)] += pts
    ranks = [EN.Rank(h, r, sorted(dict(steps[(h, r)]).items()), sorted(dict(tokens.get((h, r), [])).items()))
             for h, r in steps]
    return gpus, ranks, dict(on_gpu)


def from_recording(rec, lo: float | None = None, hi: float | None = None) -> tuple[list[EN.Energy], EN.Energy]:
    """Per-group rows and the job's row over [lo, hi] (None: the whole recording)."""
    def pairs(spec, t0=None, t1=None):
        return [(s.get, list(s.points)) for s in rec.series(spec.name, t0, t1)]
    gpus, ranks, on_gpu = _build(pairs(N.GPU_MEMORY_USAGE, lo, hi), pairs(N.GPU_ENERGY),
                                 pairs(N.GPU_PROCESS_MEMORY, None if lo is None else lo - PROCESS_LOOKBACK_S, hi),
                                 pairs(N.TRAIN_STEPS), pairs(N.TRAIN_TOKENS))
    return EN.per_gpu(gpus, ranks, on_gpu, lo, hi)


def _getter(labels: dict[str, str]) -> Callable[[str], str]:
    return lambda key, default="": labels.get(key.replace(".", "_"), default)


def from_prometheus(query: Callable[[str, float], list], node_sel: str, job_sel: str, lo: float, hi: float,
                    lookback_s: float = 300.0) -> tuple[list[EN.Energy], EN.Energy]:
    """The same over [lo, hi] from PromQL; `query(promql, at)` returns series with `.labels` and
    `.points`; `node_sel`/`job_sel`: label matchers (no braces) for the agent's and the ranks' series."""
    def raw(spec, sel: str, span: float, fn: str = "") -> list:
        """Every sample in (hi - span, hi]; with `fn` (last_over_time) one per series: its labels are the point."""
        sel = "{" + sel + "}" if sel else ""
        expr = f"{spec.prometheus_name()}{sel}[{max(1, round(span * 1000))}ms]"
        return [(_getter(s.labels), [(float(t), float(v)) for t, v in s.points])
                for s in query(f"{fn}({expr})" if fn else expr, hi)]
    span = hi - lo
    return EN.per_gpu(*_build(raw(N.GPU_MEMORY_USAGE, node_sel, span, "last_over_time"),
                              raw(N.GPU_ENERGY, node_sel, span + lookback_s),
                              raw(N.GPU_PROCESS_MEMORY, node_sel, span + PROCESS_LOOKBACK_S, "last_over_time"),
                              raw(N.TRAIN_STEPS, job_sel, span + lookback_s),
                              raw(N.TRAIN_TOKENS, job_sel, span + lookback_s)), lo, hi)
