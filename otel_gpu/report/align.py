"""Recorded points placed on the time they describe, for the report's plots (pure, numpy).

A recorded point carries its export time T; what it describes is the interval before T:
- a cumulative counter's increase since the previous point happened in (T_prev, T];
- an agent gauge is the mean of the samples taken in the export window before T (a windowed
  gauge) or the latest sample (a plain one), each sample itself describing the sampling
  interval before it (NVML utilization: its last 1/6 to 1 s; GPM: the time since the previous
  GPM sample). The OTel SDK stamps observable points with the collection time and its
  `Observation` takes no timestamp, so the agent cannot stamp a window's end itself.

So every value is a *segment* (a, b] with a constant value, and a plot cell shows the
time-weighted mean of the segments it meets: never a value drawn at its stamp and interpolated
to the next one (which moves every event later by up to an interval and smears its edges).
"""
from __future__ import annotations

import numpy as np

MAX_CELLS = 600     # cells per plot over the whole time axis
MIN_CELL_S = 0.25   # finest cell (s): a quarter of a recorded run's 1 s export interval
GAUGE_CAP = 1.5     # a gauge point holds at most this many typical intervals back (a gap stays a gap)

Segments = tuple[np.ndarray, np.ndarray, np.ndarray]   # (starts, ends, values): value over (start, end]


def cell_edges(start: float, end: float, max_cells: int = MAX_CELLS, min_s: float = MIN_CELL_S) -> np.ndarray:
    """Edges (unix s) of equal cells from `start` covering `end`: at most `max_cells`, at least `min_s` wide."""
    width = max(min_s, (end - start) / max_cells)
    n = max(1, int(np.ceil((end - start) / width - 1e-9)))
    return start + width * np.arange(n + 1)


def on_cells(seg: Segments, edges: np.ndarray) -> np.ndarray:
    """Per cell (edges[i], edges[i+1]]: the time-weighted mean of the segments' values over the part
    of the cell they cover (segments sorted, not overlapping); NaN where no segment covers it."""
    a, b, v = (np.asarray(x, dtype=float) for x in seg)
    if not len(a):
        return np.full(len(edges) - 1, np.nan)
    length = np.maximum(b - a, 0.0)
    area = np.cumsum(v * length)
    cover = np.cumsum(length)
    x = np.empty(2 * len(a))
    x[0::2], x[1::2] = a, b
    f, c = np.empty_like(x), np.empty_like(x)
    f[0], c[0] = 0.0, 0.0
    f[2::2], c[2::2] = area[:-1], cover[:-1]   # flat across the gap before each segment
    f[1::2], c[1::2] = area, cover
    df = np.diff(np.interp(edges, x, f))
    dc = np.diff(np.interp(edges, x, c))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(dc > 1e-6, df / np.where(dc > 1e-6, dc, 1.0), np.nan)


def typical_interval(t: np.ndarray, default: float = 1.0) -> float:
    """The median spacing of a series' points (s), `default` with under two points."""
    d = np.diff(np.asarray(t, dtype=float))
    d = d[d > 0]
    return float(np.median(d)) if len(d) else default


def gauge_segments(t, v, interval: float | None = None) -> Segments:
    """A gauge: each value holds over the interval before its stamp, back to the previous point but
    no further than GAUGE_CAP typical intervals (the first point: one typical interval)."""
    t, v = np.asarray(t, dtype=float), np.asarray(v, dtype=float)
    if not len(t):
        return t, t, v
    step = interval or typical_interval(t)
    prev = np.concatenate([[t[0] - step], t[:-1]])
    return np.maximum(prev, t - GAUGE_CAP * step), t, v


def increases(v) -> np.ndarray:
    """A cumulative counter's increase at each point (a drop is a restart: counted from zero)."""
    v = np.asarray(v, dtype=float)
    d = np.diff(v, prepend=0.0)
    return np.where(d < 0, v, d)


def counter_segments(t, v, zero_at: float | None = None, max_rate: float | None = None) -> Segments:
    """A cumulative counter as rates over (previous point, point]. `zero_at`: the time it was known to
    be zero (training counters appear with their first non-zero value), else the first point only
    anchors. `max_rate` (a seconds counter of one process: 1): an increase faster than that is
    spread back over earlier intervals (time counted when a long phase ended ran before)."""
    t, v = np.asarray(t, dtype=float), np.asarray(v, dtype=float)
    if zero_at is not None and len(t) and zero_at < t[0]:
        t, v = np.concatenate([[zero_at], t]), np.concatenate([[0.0], v])
    if len(t) < 2:
        return np.empty(0), np.empty(0), np.empty(0)
    a, b, inc = t[:-1], t[1:], increases(v)[1:]
    if max_rate is not None:
        inc = spill_back(inc, (b - a) * max_rate)
    with np.errstate(invalid="ignore", divide="ignore"):
        return a, b, np.where(b > a, inc / (b - a), np.nan)


def spill_back(inc: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Increases moved back to earlier intervals where one exceeds its interval's `room` (latest first)."""
    out, carry = np.array(inc, dtype=float), 0.0
    for i in range(len(out) - 1, -1, -1):
        total = out[i] + carry
        out[i] = min(total, room[i])
        carry = total - out[i]
    out[0] += carry   # what no earlier interval could hold stays in the first
    return out


def step_ends(t, sums) -> np.ndarray:
    """Per export, the latest time its counted steps can have ended (unix s): steps run back to back
    (a step is the time from one step boundary to the next), so the steps counted between exports k and
    j took sums[j] - sums[k] and ended by t[j]: the end at k is at most min over j >= k of
    t[j] - (sums[j] - sums[k]). Never after t[k]; exact when a later export came right after a step
    ended. A restart (a drop in `sums`) leaves the export times as they are."""
    t, sums = np.asarray(t, dtype=float), np.asarray(sums, dtype=float)
    if len(t) == 0 or np.any(np.diff(sums) < 0):
        return t
    slack = np.minimum.accumulate((t - sums)[::-1])[::-1]
    return np.minimum(t, sums + slack)


def first_step_start(t, sums) -> float | None:
    """When the first counted step began (unix s): the earliest t - sums (see `step_ends`)."""
    t, sums = np.asarray(t, dtype=float), np.asarray(sums, dtype=float)
    return float(np.min(t - sums)) if len(t) and not np.any(np.diff(sums) < 0) else (float(t[0] - sums[0]) if len(t) else None)


def step_segments(t, sums, counts) -> Segments:
    """Step durations (a histogram's cumulative sum and count, s): the mean of the steps counted at each
    export, over the time those steps ran: back from when they ended (`step_ends`) by their summed
    duration, never before the end of the steps counted at an earlier export."""
    ends = step_ends(t, sums)
    ds, dc = increases(sums), increases(counts)
    a, b, vals, prev_end = [], [], [], -np.inf
    for end, s, c in zip(ends, ds, dc):
        if c <= 0:
            continue
        a.append(min(max(end - s, prev_end), end))
        b.append(end)
        vals.append(s / c)
        prev_end = end
    return np.asarray(a), np.asarray(b), np.asarray(vals)
