"""Stall: no step completes on any rank for long while the ranks still export; named by who holds it.

The job is stalled when the newest step of any rank (`otelgpu.train.step.last`) is older than
max(`step_factor` x the job's median step, `min_s`), measured at the newest point the ranks sent
(so a backend that lags does not stretch it), and the ranks still export (their processes live).
Ranks that all spent most of the last minute in checkpoint or eval are saving or evaluating: no
finding. The finding names the ranks that HOLD the others up, not the ones waiting for them:

- NCCL: each rank's Flight Recorder says the last collective it started on each process group
  (`otelgpu.train.collective.seq`); the ranks behind the others' number on a group never arrived
  (as NVRx's Flight Recorder attribution does). Every rank at the same number with none completed:
  the collective itself does not finish (network, NCCL, a GPU), and every rank is named.
- gloo and other host-blocking backends: `otelgpu.train.collective.open` says who has been inside a
  collective, and since when; the ranks not inside one, while others have waited at least
  `wait_share` of the stall, hold them up.
- A rank whose series stopped during the stall (its process died) holds the others up too.
Without any of this the finding says it cannot tell and names every stalled rank (confidence low).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..words import count, noun
from . import fmt
from .findings import Finding
from .model import RECENT_S, RankStats, Window
from .thresholds import Thresholds


@dataclass
class Blame:
    """Who holds the others up, how sure, and the sentence that says why."""
    ranks: list[RankStats]
    confidence: str
    how: str
    basis: str                                   # "flight_recorder" | "host_waits" | "gone" | "only_rank" | "none"
    evidence: dict[str, Any] = field(default_factory=dict)


def typical_step(r: RankStats) -> float | None:
    """The rank's step for the limit: the longer of its mean step in the window and since it started
    (a window that holds few steps, or none, still has the rank's usual step)."""
    xs = [x for x in (r.mean_step_s, r.life_step_s) if x]
    return max(xs) if xs else None


def _rank_key(rank: str):
    return (int(rank) if rank.isdigit() else 1 << 30, rank)


def _names(ranks: list[RankStats]) -> str:
    return f"{noun(len(ranks), 'rank')} {fmt.compact([r.rank for r in ranks])}"


def _open(r: RankStats) -> tuple[str, float]:
    """(kind, seconds) of the rank's longest host wait still open at its last point; ("", 0) when none."""
    if not r.collective_open:
        return "", 0.0
    kind = max(r.collective_open, key=lambda k: r.collective_open[k])
    return kind, r.collective_open[kind]


def by_sequence(ranks: list[RankStats]) -> Blame | None:
    """NCCL: the ranks behind the others' last started collective on some process group; None when no
    group is known to two ranks, or every group agrees and nothing is in flight."""
    groups: dict[str, dict[str, dict[str, float]]] = {}
    for r in ranks:
        for group, states in r.collective_seq.items():
            if "started" in states:
                groups.setdefault(group, {})[r.rank] = states
    groups = {g: per for g, per in groups.items() if len(per) >= 2}
    if not groups:
        return None
    seq = {g: {rank: s["started"] for rank, s in per.items()} for g, per in groups.items()}
    behind = {g: sorted((rank for rank, n in per.items() if n < max(per.values())), key=_rank_key)
              for g, per in seq.items()}
    behind = {g: late for g, late in behind.items() if late}
    if behind:
        late = {rank for ranks_ in behind.values() for rank in ranks_}
        parts = []
        for g, ranks_ in behind.items():
            top = max(seq[g].values())
            parts.append(f"on process group {g} the others started collective #{top:,.0f} while "
                         f"{noun(len(ranks_), 'rank')} {fmt.compact(ranks_)} only got to "
                         f"#{min(seq[g][x] for x in ranks_):,.0f}")
        return Blame([r for r in ranks if r.rank in late], "high", "; ".join(parts) + " (Flight Recorder)",
                     "flight_recorder", {"behind": behind, "started": seq})
    stuck = {g: int(max(seq[g].values())) for g, per in groups.items()
             if any(s.get("completed", -1) < s["started"] for s in per.values())}
    if stuck:
        where = ", ".join(f"#{n:,} on {g}" for g, n in stuck.items())
        return Blame(list(ranks), "medium", f"every rank started the same collective ({where}) and it has not "
                     "completed: the collective itself does not finish (network, NCCL or a GPU)",
                     "flight_recorder", {"in_flight": stuck, "started": seq})
    return None


def by_host_waits(ranks: list[RankStats], newest: float, silence: float, share: float) -> Blame | None:
    """gloo: the ranks not inside a collective while others have waited in one for `share` of the stall;
    None without the open-wait series."""
    if not any(r.collective_open for r in ranks):
        return None
    waiting = {}
    for r in ranks:
        kind, open_s = _open(r)
        if open_s > 0 and r.last_t is not None and newest - (r.last_t - open_s) >= share * silence:
            waiting[r.rank] = (kind, newest - (r.last_t - open_s))
    ev = {"waiting": {k: {"collective": kind, "seconds": round(s, 3)} for k, (kind, s) in waiting.items()}}
    if not waiting:
        return Blame(list(ranks), "low", "no rank is inside a collective: each is held up by its own work "
                     "(data loading, I/O, a lock, code between steps)", "host_waits", ev)
    holding = [r for r in ranks if r.rank not in waiting]
    kinds = sorted({kind for kind, _ in waiting.values()})
    longest = max(s for _, s in waiting.values())
    waiters = [r for r in ranks if r.rank in waiting]
    if holding:
        how = (f"{_names(holding)} {'is' if len(holding) == 1 else 'are'} not inside a collective while "
               f"{_names(waiters)} {'has' if len(waiters) == 1 else 'have'} waited in {', '.join(kinds)} "
               f"for up to {fmt.secs(longest)}")
        return Blame(holding, "high", how, "host_waits", ev)
    if len(kinds) > 1:
        return Blame(list(ranks), "medium", f"every rank waits, in different collectives ({', '.join(kinds)}): "
                     "the ranks called collectives in a different order", "host_waits", ev)
    return Blame(list(ranks), "low", f"every rank waits in {kinds[0]}: a peer outside these series, or the "
                 "transport, holds them", "host_waits", ev)


def blame(alive: list[RankStats], gone: list[RankStats], newest: float, silence: float, share: float) -> Blame:
    """Who holds the job: the Flight Recorder first, then host waits; ranks gone during the stall added."""
    found = by_sequence(alive + gone) or by_host_waits(alive, newest, silence, share)
    if gone:
        said = (f"{_names(gone)} stopped exporting at {fmt.when(max(r.last_t for r in gone))} UTC while the "
                f"others still run: {'its process' if len(gone) == 1 else 'their processes'} may have died")
        if found is None or found.confidence == "low":
            return Blame(gone, "medium", said, "gone", found.evidence if found else {})
        ranks = gone + [r for r in found.ranks if r not in gone and r in alive]
        return Blame(ranks, found.confidence, f"{said}; {found.how}", found.basis, found.evidence)
    if found is not None:
        return found
    if len(alive) == 1:
        return Blame(alive, "medium", "it is the job's only rank", "only_rank")
    return Blame(alive, "low", "which rank holds the others cannot be told: no collective data (no host-timed "
                 "waits, no Flight Recorder sequence numbers)", "none")


def _limit_basis(t: dict[str, float], median: float | None) -> str:
    if median is None:
        return "no step time known"
    return f"the larger of {t['step_factor']:g} x the median step {fmt.secs(median)} and {t['min_s']:g} s"


def stall(w: Window, th: Thresholds) -> list[Finding]:
    """Critical when no step completed on any rank for the limit while the ranks still export."""
    t = th["stall"]
    stepped = [r for r in w.ranks if r.step_last_t is not None]
    seen = [r for r in w.ranks if r.last_t is not None]
    if not stepped or not seen:
        return []
    newest = max(r.last_t for r in seen)
    latest = max(stepped, key=lambda r: r.step_last_t)
    since = latest.step_last_t
    silence = newest - since
    steps = [x for x in map(typical_step, stepped) if x]
    median = statistics.median(steps) if steps else None
    limit = max(t["step_factor"] * median, t["min_s"]) if median else t["min_s"]
    if silence < limit:
        return []
    gone_s = max(t["gone_s"], 3 * w.interval_s)
    alive = [r for r in seen if newest - r.last_t <= gone_s]
    gone = [r for r in seen if r not in alive and r.last_t >= since]   # stopped during the stall
    recent = min(RECENT_S, silence, w.duration_s)
    if all((r.recent_outside_s or 0.0) >= t["outside_share"] * recent for r in alive):
        return []   # every rank is saving or evaluating
    who = blame(alive, gone, newest, silence, t["wait_share"])
    n = len(w.gpus) or len(alive) + len(gone)
    at_stake = min(silence, w.duration_s)
    step_no = f"step {latest.steps_total:,.0f} on rank {latest.rank}" if latest.steps_total else f"rank {latest.rank}"
    named = _names(who.ranks)
    if who.confidence == "low":
        title = f"Job stalled: no step for {fmt.secs(silence)}; which rank holds the others up is not known ({named})"
    else:
        title = f"Job stalled: no step for {fmt.secs(silence)}; {named} {'holds' if len(who.ranks) == 1 else 'hold'} the others up"
    per_rank = {r.rank: {"host": r.host, "last_point": r.last_t, "step_last": r.step_last_t, "steps": r.steps_total,
                         "collective_open": dict(r.collective_open), "collective_seq": dict(r.collective_seq)}
                for r in alive + gone}
    return [Finding(
        rule="stall", title=title, severity="critical", confidence=who.confidence,
        seen=(f"no step since {fmt.when(since)} UTC ({step_no}): {fmt.secs(silence)} before the newest data, while "
              f"{count(len(alive), 'rank')} still export{'s' if len(alive) == 1 else ''}; the limit is "
              f"{fmt.secs(limit)} ({_limit_basis(t, median)}). {who.how[0].upper()}{who.how[1:]}."),
        why=(f"while no step completes the job makes no progress: {fmt.gpu_time(at_stake * n, w.unit)} so far in "
             "this window, and a collective's timeout or the scheduler's time limit may end it with nothing saved "
             "since its last checkpoint"),
        action=(f"look at what {named} {'is' if len(who.ranks) == 1 else 'are'} doing: the Python stacks (`otel-gpu "
                "run --record` asks every rank for them into the run directory's stacks/ when a stall appears; "
                "elsewhere `py-spy dump --pid PID`), the rank's log and its node (a dead data-loader worker, a "
                "stuck file system, a GPU error); otel-gpu never stops the job"),
        lost_s=at_stake * n, lost_share=at_stake / w.duration_s if w.duration_s > 0 else None,
        basis=f"{w.unit}s x seconds since the last step, within the window",
        where={"ranks": [r.rank for r in who.ranks], "nodes": sorted({r.host for r in who.ranks if r.host})},
        ranges=[(since, newest)],
        evidence={"since": since, "stalled_s": round(silence, 3), "limit_s": round(limit, 3),
                  "median_step_s": median, "last_step_rank": latest.rank, "last_step": latest.steps_total,
                  "attribution": who.basis, "gone": [r.rank for r in gone], **who.evidence, "ranks": per_rank})]
