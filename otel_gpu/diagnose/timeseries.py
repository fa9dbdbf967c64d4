"""Pure helpers over a timeline: the activity signal, drops as events, their period, alignment."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from .model import Timeline, Window


@dataclass(frozen=True)
class Event:
    """A stretch of consecutive grid points, [start, end] in unix seconds, with its mean level."""
    start: float
    end: float
    level: float     # mean signal value inside
    points: int

    @property
    def duration_s(self) -> float:
        return self.end - self.start


def training_mask(w: Window) -> list[bool]:
    """Timeline points that describe training time only: at or before the ranks' last step and at least
    one smoothing range (grid step + two export intervals: what each point averages over) after their
    first step began; without that margin where no point qualifies. All points without ranks."""
    t = w.timeline.t
    if w.train_start is None or w.train_end is None:
        return [True] * len(t)
    smooth = w.step_s + 2 * w.interval_s
    strict = [w.train_start + smooth <= x <= w.train_end for x in t]
    if any(strict):
        return strict
    return [w.train_start <= x <= w.train_end for x in t]


def only(values: list[float | None], mask: list[bool]) -> list[float | None]:
    """`values` with the points outside `mask` left out (None)."""
    return [v if m else None for v, m in zip(values, mask)]


def activity(w: Window, training_only: bool = True) -> tuple[str, list[float | None]] | None:
    """The best job-wide activity signal: GPU SM activity, else GPU utilization, else step rate; by
    default over training time only (start-up before the first step left out)."""
    keep = training_mask(w) if training_only else None
    for name, what in (("sm", "GPU SM activity"), ("util", "GPU utilization"), ("steps", "step rate")):
        values = w.timeline.get(name)
        if values and keep is not None:
            values = only(values, keep)
        if values and sum(v is not None for v in values) >= 3:
            return what, values
    return None


def during(w: Window, mask: list[bool], values: list[float | None] | None) -> tuple[float | None, float | None]:
    """Mean of `values` inside `mask`, and over the rest of the training time ("otherwise": never the
    start-up before the first step nor the time after the last)."""
    train = training_mask(w)
    return mean_where(values, mask), mean_where(values, [not m and k for m, k in zip(mask, train)])


def median(values: list[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def below(values: list[float | None], limit: float) -> list[bool]:
    return [v is not None and v < limit for v in values]


def above(values: list[float | None] | None, limit: float, n: int) -> list[bool]:
    if values is None:
        return [False] * n
    return [v is not None and v > limit for v in values]


def events(t: list[float], mask: list[bool], values: list[float | None], step: float) -> list[Event]:
    """Runs of True in `mask` as events; each spans its points' times plus one grid step."""
    out, i, n = [], 0, len(mask)
    while i < n:
        if not mask[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and mask[j + 1]:
            j += 1
        inside = [v for v in values[i:j + 1] if v is not None]
        out.append(Event(t[i] - step / 2, t[j] + step / 2, statistics.fmean(inside) if inside else 0.0, j - i + 1))
        i = j + 1
    return out


def period(evts: list[Event]) -> tuple[float, float] | None:
    """(median interval between event starts in seconds, coefficient of variation), or None."""
    if len(evts) < 3:
        return None
    gaps = [b.start - a.start for a, b in zip(evts, evts[1:])]
    med = statistics.median(gaps)
    if med <= 0:
        return None
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    return med, cv


def overlaps(e: Event, t: list[float], mask: list[bool], step: float) -> bool:
    """True when any masked grid point lies within the event (one step of slack each side)."""
    return any(m and e.start - step <= x <= e.end + step for x, m in zip(t, mask))


def share_inside(evts: list[Event], t: list[float], mask: list[bool]) -> float:
    """Share of the grid points inside the events (no slack) where ``mask`` is True."""
    inside = hits = 0
    for e in evts:
        for x, m in zip(t, mask):
            if e.start <= x <= e.end:
                inside += 1
                hits += bool(m)
    return hits / inside if inside else 0.0


def mean_where(values: list[float | None] | None, mask: list[bool]) -> float | None:
    if values is None:
        return None
    xs = [v for v, m in zip(values, mask) if m and v is not None]
    return statistics.fmean(xs) if xs else None


def phase_mask(tl: Timeline, phase: str, min_share: float = 0.0) -> list[bool]:
    """Grid points where some rank spent time in `phase` (ranks in the phase > `min_share`)."""
    return above(tl.get(f"phase_{phase}"), min_share, len(tl.t))
