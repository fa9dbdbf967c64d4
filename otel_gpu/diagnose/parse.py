"""PromQL answers -> window parts (pure): the union queries of `queries.py` split by their tag label,
counter increases, timelines on the window's grid, phase occupancy, checkpoint ranges, busy time."""
from __future__ import annotations

import math
import statistics
from typing import Any

from .. import names as N
from ..promql import Series
from . import queries as Qb
from .health import health_inputs
from .model import GpuStats, NodeStats, RankStats, Timeline
from .work import peak_inputs, work_inputs


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
        bases = {k[len("collbasis_"):] or "host" for k in v if k.startswith("collbasis_") and v[k] is not None}
        unmeasured = {k[len("collun_"):]: v[k] for k in v if k.startswith("collun_") and v[k]}
        out.append(RankStats(
            rank=rank, host=host, steps=_increase(v, "steps") or 0.0, step_time_s=_increase(v, "step_sum") or 0.0,
            step_count=_increase(v, "step_count") or 0.0, phases=phases,
            samples=int(v.get("n") or 0), first_t=v.get("t0"),
            last_t=v.get("t1") if v.get("t1") is not None else v.get("t1m"),
            first_step_s=v.get("first_sum"), started=v.get("steps0") is None,
            collective_s=sum(v for p, v in coll.items() if p not in N.OUTSIDE_STEPS) if coll else None,
            collective_by_phase=coll,
            collective_by_kind=kinds, param_gather_s=_increase(v, "fetch") or 0.0,
            collective_basis=basis_of(bases) if coll else "",
            collective_unmeasured=unmeasured, saves=_increase(v, "saves"), **stall_inputs(v), **work_inputs(v),
            **health_inputs(v)))
    return out


def stall_inputs(v: dict[str, Any]) -> dict[str, Any]:
    """A rank's RankStats fields for the stall rule, from its rank_summary statistics."""
    seqs: dict[str, dict[str, float]] = {}
    for prefix, state in (("seqs_", "started"), ("seqc_", "completed")):
        for k, x in v.items():
            if k.startswith(prefix) and x is not None:
                seqs.setdefault(k[len(prefix):], {})[state] = x
    recent = [v[k] for k in ("recent_ph", "recent_co") if v.get(k) is not None]
    count, total = v.get("step_count"), v.get("step_sum")
    return dict(step_last_t=v.get("steplast"), steps_total=v.get("steps"),
                life_step_s=total / count if count and total is not None else None,
                collective_open={k[len("open_"):]: x for k, x in v.items() if k.startswith("open_") and x is not None},
                collective_seq=seqs, recent_outside_s=sum(recent) if recent else None)


def basis_of(bases: set[str]) -> str:
    """The one basis of a rank's collective time ('' on old series counts as host), or "mixed"."""
    bases = {b or "host" for b in bases}
    return bases.pop() if len(bases) == 1 else "mixed" if bases else "host"


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
    latest-save start/end times (see `pair_saves`)."""
    starts: dict[tuple[str, str], set[float]] = {}
    ends: dict[tuple[str, str], set[float]] = {}
    for s in result:
        key = (s.labels.get("host_name", ""), s.labels.get("otelgpu_rank", ""))
        into = ends if s.labels.get("otelgpu_checkpoint_event") == "end" else starts
        into.setdefault(key, set()).update(v for _, v in s.points)
    return {key: pair_saves(starts.get(key, set()), done, start, end) for key, done in ends.items()}


def pair_saves(starts: set[float], ends: set[float], start: float, end: float) -> list[tuple[float, float]]:
    """Save (start, end) pairs from the distinct latest-save start and end times seen: each distinct
    end is one save, paired with the latest start before it; saves outside [start, end] left out."""
    begun = sorted(x for x in starts if math.isfinite(x))
    out = []
    for e in sorted(x for x in ends if math.isfinite(x)):
        before = [b for b in begun if b <= e]
        if before and e >= start and before[-1] <= end:
            out.append((before[-1], e))
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
            host=host, gpu=index, uuid=uuid, util=v.get("util"), sm=v.get("sm"), tensor=v.get("tensor"),
            dram=v.get("dram"), occupancy=v.get("occupancy"), power_w=v.get("power"),
            power_limit_w=v.get("power_limit"), temp_c=v.get("temp"), temp_max_c=v.get("temp_max"),
            clock_hz=v.get("clock"), clock_max_hz=v.get("clock_max"), mem_used_b=v.get("mem_used"),
            mem_limit_b=v.get("mem_limit"),
            throttle={k[len("throttle_"):]: x for k, x in v.items() if k.startswith("throttle_") and x is not None},
            ranks=sorted((k[len("rank_"):] for k in v if k.startswith("rank_") and k != "rank_"), key=_int),
            model=min((k[len("model_"):] for k in v if k.startswith("model_") and k != "model_"), default=""),
            pcie_gen=v.get("pcie_gen"), pcie_width=v.get("pcie_width"), peaks=peak_inputs(v),
            sm_clock_limit_hz=v.get("clock_limit"),
            driver=max((k[len("driver_"):] for k in v if k.startswith("driver_") and k != "driver_"), default=""),
            samples=int(v.get("n") or 0), first_t=v.get("t0"), last_t=v.get("t1")))
    return out


def _int(s: str) -> int:
    return int(s) if s.isdigit() else 1 << 30


def parse_nodes(result: list[Series]) -> list[NodeStats]:
    return [node_stats(host, v) for (host,), v in sorted(split_union(result, ("host_name",)).items())
            if any(x is not None for x in v.values())]


def node_stats(host: str, v: dict[str, Any]) -> NodeStats:
    """One node from its statistics keyed as `queries.node_summary` tags them; the interconnect is
    InfiniBand when its ports have a speed, else Ethernet."""
    ib = v.get("ib_limit")
    kind = "infiniband" if ib else ("ethernet" if v.get("eth_limit") else "")
    return NodeStats(
        host=host, cpu_busy=v.get("cpu_busy"), mem_used=v.get("mem_used"), swap_used_b=v.get("swap_used"),
        swap_pages_per_s=v.get("swap_rate"), nic_errors=v.get("nic_errors"), ib_errors=v.get("ib_errors"),
        link_Bps=v.get("ib_rate") if kind == "infiniband" else v.get("eth_rate"),
        link_limit_Bps=ib if kind == "infiniband" else v.get("eth_limit"), link_kind=kind,
        disk_write_Bps=v.get("disk_write"), job_cpu=v.get("job_cpu"), cpus=v.get("cpus"))


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
