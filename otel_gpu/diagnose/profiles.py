"""Profiles for the communication rule: a flame-graph-like summary of where training threads wait.

`ProfileSummary` holds, per group (a rank, or "all"), the sample weight (seconds) of training
threads, of those waiting in communication, and self/total weight per function. Training
threads are those whose samples carry the phase tag that `otel_gpu.training` sets, plus any
thread inside a communication function (autograd threads blocked in a gather carry no tag);
otel-gpu's own threads (exporters, the profiler's) are left out, as the report's flame graphs
leave them out (one definition: otel_gpu.profile_threads.is_own).

Built from pprof samples as the pyroscope-io agent pushes them (`from_samples`), or from
Pyroscope's render API flame graph (`from_flamebearer`, `fetch_pyroscope`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import httpx

from ..http_deadline import deadline_client, request
from ..profile_threads import is_own

# Collectives and ZeRO parameter-fetch / gradient-partition functions (matched in frame names).
COMM = re.compile(
    r"fetch_sub_module|reduce_and_partition_ipg_grads|reduce_ipg_grads|all_?gather|all_?reduce|"
    r"reduce_?scatter|all_?to_?all|(^|\.)_*(broadcast\w*|barrier|i?send|i?recv)$", re.I)
ZERO = re.compile(r"fetch_sub_module|reduce_and_partition_ipg_grads|reduce_ipg_grads|partition_param|_allgather_param", re.I)
PHASE_LABEL = "phase"
NS = 1e-9


def is_comm(function: str) -> bool:
    return bool(COMM.search(function))


def is_helper(stack: Sequence[str], labels: Mapping[str, str] | None = None) -> bool:
    """True for a sample of otel-gpu's own threads (the metrics exporter's sends over HTTP:
    `Session.send` would match the communication pattern above)."""
    return is_own(stack, labels or {})


@dataclass
class GroupProfile:
    training_s: float = 0.0          # training-thread sample weight
    comm_s: float = 0.0              # ... of which inside a communication function
    functions: dict[str, list[float]] = field(default_factory=dict)  # fn -> [self_s, total_s]


@dataclass
class ProfileSummary:
    source: str                               # "pprof" | "pyroscope"
    group_label: str = "rank"
    groups: dict[str, GroupProfile] = field(default_factory=dict)

    @property
    def training_s(self) -> float:
        return sum(g.training_s for g in self.groups.values())

    @property
    def comm_s(self) -> float:
        return sum(g.comm_s for g in self.groups.values())

    def comm_share(self, group: str | None = None) -> float:
        g = self.groups.get(group) if group is not None else None
        total, comm = (g.training_s, g.comm_s) if g else (self.training_s, self.comm_s)
        return comm / total if total > 0 else 0.0

    def top_comm(self, n: int = 5) -> list[tuple[str, float]]:
        """The communication functions with the largest total share of training-thread time."""
        totals: dict[str, float] = {}
        for g in self.groups.values():
            for fn, (_, tot) in g.functions.items():
                if is_comm(fn):
                    totals[fn] = totals.get(fn, 0.0) + tot
        base = self.training_s or 1.0
        return [(fn, v / base) for fn, v in sorted(totals.items(), key=lambda kv: -kv[1])[:n]]

    def uses_zero(self) -> bool:
        return any(ZERO.search(fn) for g in self.groups.values() for fn in g.functions)


def from_samples(samples: Iterable[tuple[Sequence[str], float, Mapping[str, str], Mapping[str, str]]],
                 group_label: str = "rank", unit_s: float = NS) -> ProfileSummary:
    """From (stack leaf-first, value, sample labels, series labels); values in `unit_s` seconds."""
    out = ProfileSummary("pprof", group_label)
    for stack, value, labels, series in samples:
        if is_helper(stack, {**series, **labels}):
            continue
        comm = any(is_comm(f) for f in stack)
        if not comm and PHASE_LABEL not in labels:
            continue
        group = labels.get(group_label) or series.get(group_label) or "all"
        g = out.groups.setdefault(group, GroupProfile())
        v = value * unit_s
        g.training_s += v
        if comm:
            g.comm_s += v
        for fn in set(stack):
            g.functions.setdefault(fn, [0.0, 0.0])[1] += v
        if stack:
            g.functions.setdefault(stack[0], [0.0, 0.0])[0] += v
    return out


def from_profiles(profiles, group_label: str = "rank") -> ProfileSummary:
    """From decoded pprof profiles with `.series` labels and `.samples` (stack, value, labels)."""
    return from_samples(((s.stack, s.value, s.labels, p.series) for p in profiles for s in p.samples), group_label)


# ---- Pyroscope flame graphs ------------------------------------------------------------------

def flamebearer_nodes(names: list[str], levels: list[list[int]]):
    """Yield (level, start, total, self, name, ancestor names) of a 'single'-format flamebearer
    (four numbers per node: offset from the previous node's end, total, self, name index)."""
    prev: list[tuple[int, int, str, frozenset]] = []   # nodes of the level above: (start, end, name, ancestors)
    for depth, level in enumerate(levels):
        cur, x = [], 0
        for i in range(0, len(level) - 3, 4):
            x += level[i]
            total, self_, name = level[i + 1], level[i + 2], names[level[i + 3]]
            parent = next((p for p in prev if p[0] <= x < p[1]), None)
            ancestors = (parent[3] | {parent[2]}) if parent else frozenset()
            yield depth, x, total, self_, name, ancestors
            cur.append((x, x + total, name, ancestors))
            x += total
        prev = cur


def flame_weights(flamebearer: Mapping, unit_s: float = NS) -> tuple[float, float, dict[str, list[float]]]:
    """(root total s, weight inside communication functions s, fn -> [self s, total s])."""
    names, levels = list(flamebearer["names"]), list(flamebearer["levels"])
    root = comm = 0.0
    functions: dict[str, list[float]] = {}
    for depth, _, total, self_, name, anc in flamebearer_nodes(names, levels):
        if depth == 0:
            root += total * unit_s
            if name == "total":
                continue
        f = functions.setdefault(name, [0.0, 0.0])
        f[0] += self_ * unit_s
        if name not in anc:
            f[1] += total * unit_s
        if is_comm(name) and not any(is_comm(a) for a in anc) and not is_helper([name, *anc]):
            comm += total * unit_s
    return root, comm, functions


def from_flamebearers(tagged: Mapping, everything: Mapping, unit_s: float = NS) -> ProfileSummary:
    """Merge two flame graphs of one window: phase-tagged samples and all samples.
    Training = tagged + untagged communication; communication = all communication."""
    t_root, t_comm, t_fns = flame_weights(tagged, unit_s)
    _, a_comm, a_fns = flame_weights(everything, unit_s)
    fns = dict(t_fns)
    for fn, v in a_fns.items():
        if is_comm(fn):
            fns[fn] = v
    g = GroupProfile(training_s=t_root + a_comm - t_comm, comm_s=a_comm, functions=fns)
    return ProfileSummary("pyroscope", "all", {"all": g})


CPU_PROFILE = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"


class PyroscopeError(RuntimeError):
    """One line: the Pyroscope server could not be read."""


def fetch_pyroscope(url: str, app: str, start: float, end: float, timeout: float = 10.0) -> ProfileSummary:
    """Two flame graphs from Pyroscope's render API (`GET /pyroscope/render`: `query`, `from`/`until` in unix
    seconds, `format=json`, `maxNodes`; answer `{"flamebearer": {"names", "levels"}, "metadata", ...}`, as
    Pyroscope 1.x's server API reference defines it): phase-tagged samples and all samples."""
    base = url.rstrip("/")

    def render(extra: str) -> Mapping:
        q = f'{CPU_PROFILE}{{service_name="{app}"{extra}}}'
        params = {"query": q, "from": str(int(start)), "until": str(int(end)), "format": "json", "maxNodes": "8192"}
        try:
            with deadline_client(timeout) as client:
                r = request(client, "GET", f"{base}/pyroscope/render", params=params, timeout=timeout)
        except httpx.TimeoutException:
            raise PyroscopeError(f"Pyroscope at {base} did not answer within {timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise PyroscopeError(f"Pyroscope at {base} is unreachable: {exc}") from None
        if r.status_code != 200:
            raise PyroscopeError(f"Pyroscope at {base} answered HTTP {r.status_code} to the render query")
        try:
            fb = r.json()["flamebearer"]
            fb["names"], fb["levels"]
        except (ValueError, KeyError, TypeError):
            raise PyroscopeError(f"Pyroscope at {base} answered the render query without a flame graph") from None
        return fb

    return from_flamebearers(render(f', {PHASE_LABEL}=~".+"'), render(""))
