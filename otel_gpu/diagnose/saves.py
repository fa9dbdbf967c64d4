"""Checkpoint saves: who saves, who waits for them, and the job's step rate while they run.

Pure functions over a window, for the checkpoint rule.

- **Savers** are the ranks that spend time writing: checkpoint seconds (own time: a barrier or
  all-gather inside a save is collective wait, not saving) at least `SAVER_SHARE` of the slowest
  rank's. A rank that only writes its RNG state while rank 0 writes the model (the Hugging Face
  Trainer) is not one.
- **Waiting ranks** are the others whose collective wait exceeds every saver's by at least
  `WAIT_SHARE` of the slowest save time: in synchronous training they sit in the next collective
  (a barrier, DDP's all-reduce, the Trainer's token-count all-gather) while the savers write.
- **Step rate during saves**: steps completed inside save windows per second of save time, over the
  job's rate outside them. A timeline point is a rate over the range before it (a grid step plus two
  export intervals); only points whose whole range lies inside one save window count as "during",
  only points whose range touches no save as "normal". So a stalled job reads 0% (its counters do
  not move inside the window) and normal steps next to a save never leak into "during", the way an
  average over points that merely overlap a save would (that read 114% of normal for a job that
  stopped at every save). Saves shorter than one range cannot be resolved: said, not guessed.
  Steps cannot run faster because a save runs beside them, so a value above normal is counter noise
  of a job that kept stepping: shown as 100%.
"""
from __future__ import annotations

import statistics

from .. import words
from . import timeseries as ts
from .model import RankStats, Window

SAVER_SHARE = 0.25   # checkpoint seconds at least this share of the slowest rank's: a saver
WAIT_SHARE = 0.5     # collective wait above the savers' by this share of the slowest save time: waiting


def savers(ranks: list[RankStats]) -> list[RankStats]:
    """The ranks that spend time saving (see module doc), slowest first."""
    secs = {r.rank: r.phases.get("checkpoint", 0.0) for r in ranks}
    top = max(secs.values(), default=0.0)
    if top <= 0:
        return []
    return sorted((r for r in ranks if secs[r.rank] >= SAVER_SHARE * top), key=lambda r: -secs[r.rank])


def waiting(ranks: list[RankStats], saving: list[RankStats]) -> dict[str, float]:
    """rank -> seconds of collective wait beyond the most-waiting saver's, for the non-savers that waited
    at least `WAIT_SHARE` of the slowest save time more (waiting for the saves)."""
    if not saving or any(r.collective_s is None for r in saving):
        return {}
    base = max(r.collective_s for r in saving)
    slowest = saving[0].phases.get("checkpoint", 0.0)
    ids = {r.rank for r in saving}
    out = {}
    for r in ranks:
        if r.rank in ids or r.collective_s is None:
            continue
        extra = r.collective_s - base
        if extra >= WAIT_SHARE * slowest and extra > 0:
            out[r.rank] = extra
    return out


def count(r: RankStats) -> int | None:
    """Saves that ended in the window, from the checkpoint-end counter (an integer); None without one."""
    return None if r.saves is None else int(round(r.saves))


def step_rate_during(w: Window, ranges: list[tuple[float, float]]) -> tuple[float | None, str]:
    """(step rate inside the save windows over the rate outside them, capped at 1; or None) and a note
    saying what was measured or why not (see module doc). `ranges` are the saves' (start, end) unix s."""
    rate = w.timeline.get("steps")
    if not rate or not ranges:
        return None, "step rate during saves not measured: no step-rate series or no save times"
    smooth = w.step_s + 2 * w.interval_s
    train = ts.training_mask(w)
    inside, outside = [], []
    for x, v, keep in zip(w.timeline.t, rate, train):
        if v is None or not keep:
            continue
        lo = x - smooth
        if any(a <= lo and x <= b for a, b in ranges):
            inside.append(v)
        elif not any(a < x and lo < b for a, b in ranges):
            outside.append(v)
    longest = max(b - a for a, b in ranges)
    if not inside:
        return None, (f"step rate during saves not measured: the saves last up to {longest:.2f} s, shorter than "
                      f"the {smooth:.1f} s each step-rate point covers")
    if not outside or statistics.fmean(outside) <= 0:
        return None, "step rate during saves not measured: no step rate outside the saves to compare with"
    share = min(1.0, statistics.fmean(inside) / statistics.fmean(outside))
    return share, (f"step rate {share * 100:.1f}% of normal during saves ({words.count(len(inside), 'point')} "
                   "wholly inside a save)")
