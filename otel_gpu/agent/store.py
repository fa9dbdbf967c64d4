"""The agent's in-memory state between sampling and export (no OTel import).

Sampling threads `put()` each source's readings; export callbacks read the latest
value of every series, and for windowed gauges the mean, min and max over the
last export window, so a stall shorter than the export interval stays visible.
Memory is bounded: one value per series plus `window_s / interval_s` samples for
windowed series; series a source stops reporting disappear.

Cost: a source reports the same series in the same order round after round, so a
put first tries the slot the series had last time (same spec, same attributes
object: sources reuse their attribute dicts) and only builds and hashes a series
key when that fails. Series keys keep their identity while they live, so the
exposition's "are this family's series unchanged?" is mostly an identity check.
"""
from __future__ import annotations

import threading
from collections import deque
from math import isfinite
from typing import Iterable, Mapping

from ..readings import MetricSpec, Reading

Attrs = tuple[tuple[str, str], ...]


def attrs_key(attributes: Mapping[str, str]) -> Attrs:
    """The series key: attributes in insertion order (sources build them in a fixed order;
    sorting every reading's attributes was the largest cost of a sampling round)."""
    return tuple(attributes.items())


class _Cell:
    """One series: its latest value and, when windowed, the samples of the window and their sum."""

    __slots__ = ("value", "serial", "times", "values", "total", "lo", "hi", "n_lo", "n_hi", "fresh", "stale")

    def __init__(self, windowed: bool):
        self.value = 0.0
        self.serial = 0
        self.times: deque | None = deque() if windowed else None
        self.values: deque | None = deque() if windowed else None
        self.total = 0.0
        # window extremes, kept up to date at export: `fresh` values were appended since, `n_lo` /
        # `n_hi` count the older values equal to `lo` / `hi`, and `stale` says the last of them
        # left the window (then min/max are computed anew)
        self.lo = self.hi = 0.0
        self.n_lo = self.n_hi = 0
        self.fresh = 0
        self.stale = True

    def add(self, now: float, value: float, oldest: float) -> None:
        """A sample at `now` (s) in a windowed series; samples older than `oldest` leave the window
        (`Store.put`'s common-case loop does the same inline)."""
        self.times.append(now)
        self.values.append(value)
        self.total += value
        self.fresh += 1
        if self.times[0] < oldest:
            self.trim(oldest)

    def trim(self, oldest: float) -> None:
        times, values = self.times, self.values
        while times and times[0] < oldest:
            times.popleft()
            older = len(values) > self.fresh   # else it is a fresh value: min/max are computed anew
            v = values.popleft()
            self.total -= v
            if not self.lo < v < self.hi and older:   # an extreme (or NaN) left the window
                # stale when the last value equal to it left, or a zero (min/max give the first
                # of 0.0 and -0.0: computed anew, so is its sign), or a NaN
                if v == self.lo:
                    self.n_lo -= 1
                    if not self.n_lo or not v:
                        self.stale = True
                if v == self.hi:
                    self.n_hi -= 1
                    if not self.n_hi or not v:
                        self.stale = True
                if v != v:
                    self.stale = True
        # restart the running sum exactly whenever one sample is left: rounding error grows by
        # ~1e-16 of the values per sample otherwise (negligible, but not zero)
        if len(values) == 1:
            self.total = values[0]


# (spec, attributes object, key, cell) of one reading of the last put
_Slot = tuple[MetricSpec, Mapping[str, str], Attrs, _Cell]


class Store:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._lock = threading.Lock()
        self._series: dict[str, dict[Attrs, _Cell]] = {}
        self._slots: dict[str, list[_Slot]] = {}   # per source, in the order of its last put
        self._specs: dict[str, MetricSpec] = {}    # name -> its spec (windowed? companions?)
        self._serial = 0          # bumped by every put: invalidates the columns cache
        self._columns: tuple[int, float, dict] | None = None

    def put(self, source: str, readings: Iterable[Reading], now: float) -> None:
        """Replace everything `source` reported before with `readings` taken at `now` (s)."""
        if not isinstance(readings, (list, tuple)):
            readings = list(readings)
        with self._lock:
            self._serial += 1
            serial, oldest = self._serial, now - self.window_s
            prev = self._slots.get(source, ())
            n_prev = len(prev)
            # the common case first: each reading in the slot it had last time (same spec, same
            # attributes object); a reading that is not goes on below, from where it stands
            i = 0
            for slot, (spec, value, attrs) in zip(prev, readings):
                if slot[0] is not spec or slot[1] is not attrs:
                    break
                cell = slot[3]
                cell.value = value
                values = cell.values
                if values is not None:   # windowed: _Cell.add inlined (the hottest loop of a round)
                    times = cell.times
                    times.append(now)
                    values.append(value)
                    cell.total += value
                    cell.fresh += 1
                    if times[0] < oldest:
                        cell.trim(oldest)
                i += 1
            if i == n_prev == len(readings):
                return   # the same series as last time, in the same order: none gone
            for slot in prev[:i]:
                slot[3].serial = serial   # reported: not gone
            slots = list(prev[:i])
            for spec, value, attrs in readings[i:]:
                slot = prev[i] if i < n_prev else None
                if slot is None or slot[0] is not spec or slot[1] is not attrs:
                    slot = self._slot(spec, attrs)
                slots.append(slot)
                i += 1
                cell = slot[3]
                cell.value = value
                cell.serial = serial
                if cell.times is not None:
                    cell.add(now, value, oldest)
            for spec, _, key, cell in prev:
                if cell.serial != serial:   # not reported this time: gone
                    series = self._series.get(spec.name, {})
                    if series.get(key) is cell:
                        del series[key]
            self._slots[source] = slots

    def _slot(self, spec: MetricSpec, attrs: Mapping[str, str]) -> _Slot:
        series = self._series.get(spec.name)
        if series is None:
            series = self._series[spec.name] = {}
            self._specs[spec.name] = spec
        key = attrs_key(attrs)
        cell = series.get(key)
        if cell is None:
            cell = series[key] = _Cell(spec.windowed)
        return spec, attrs, key, cell

    def forget(self, source: str) -> None:
        """Drop every series of `source` (it failed as a whole)."""
        self.put(source, (), 0.0)

    def columns(self, now: float) -> dict[str, tuple]:
        """Every name's export columns in one pass, cached until the next put (the mean, min
        and max families of one export, and every family of one scrape, share it):
        (values, keys) for plain series, (means, mins, maxs, keys) for windowed ones."""
        cached = self._columns   # without the lock first: a scrape asks once per family (~60 times)
        if cached is not None and cached[0] == self._serial and abs(cached[1] - now) < 0.05:
            return cached[2]     # computed after the last complete put (a put bumps the serial first)
        with self._lock:
            cached = self._columns
            if cached is not None and cached[0] == self._serial and abs(cached[1] - now) < 0.05:
                return cached[2]
            oldest, out = now - self.window_s, {}
            for name, series in self._series.items():
                spec = self._specs[name]
                if spec.windowed:
                    out[name] = self._window_columns(series, oldest, extremes=spec.companions)
                else:
                    out[name] = ([cell.value for cell in series.values()], tuple(series))
            self._columns = (self._serial, now, out)
            return out

    @staticmethod
    def _window_columns(series: dict[Attrs, _Cell], oldest: float, extremes: bool) -> tuple:
        """(means, mins, maxs, keys); mins and maxs stay empty unless `extremes`."""
        means, mins, maxs, keys = [], [], [], []
        for key, cell in series.items():
            times = cell.times
            if times and times[0] < oldest:
                cell.trim(oldest)
            values = cell.values
            if values:
                if not isfinite(cell.total):   # a NaN or inf passed through the running sum
                    cell.total = sum(values)
                    cell.stale = True
                means.append(cell.total / len(values))
                keys.append(key)
                if extremes:
                    if cell.fresh == 1 and not cell.stale and len(values) > 1:   # _extremes' commonest case
                        v = values[-1]
                        if v <= cell.lo:
                            if v < cell.lo:
                                cell.lo, cell.n_lo = v, 1
                            else:
                                cell.n_lo += 1
                        if v >= cell.hi:
                            if v > cell.hi:
                                cell.hi, cell.n_hi = v, 1
                            else:
                                cell.n_hi += 1
                        cell.fresh = 0
                    else:
                        _extremes(cell, values)
                    mins.append(cell.lo)
                    maxs.append(cell.hi)
        return means, mins, maxs, tuple(keys)

    def snapshot(self) -> dict[str, dict[Attrs, float]]:
        with self._lock:
            return {name: {key: cell.value for key, cell in series.items()} for name, series in self._series.items()}


def _extremes(cell: _Cell, values: deque) -> None:
    """Bring `cell.lo` / `cell.hi` to the min and max of `values` (its window, not empty): from
    the values appended since the last time, unless an extreme left the window since."""
    fresh = cell.fresh
    if cell.stale or fresh >= len(values):
        lo, hi = cell.lo, cell.hi = min(values), max(values)
        cell.stale = not (isfinite(lo) and isfinite(hi))   # NaN / inf: no shortcut
        if not cell.stale:
            cell.n_lo = values.count(lo)
            cell.n_hi = cell.n_lo if hi == lo else values.count(hi)
    elif fresh:
        lo, hi, n_lo, n_hi = cell.lo, cell.hi, cell.n_lo, cell.n_hi
        for i in range(-fresh, 0):
            v = values[i]
            if v <= lo:
                if v < lo:
                    lo, n_lo = v, 1
                else:
                    n_lo += 1
            if v >= hi:
                if v > hi:
                    hi, n_hi = v, 1
                else:
                    n_hi += 1
        cell.lo, cell.hi, cell.n_lo, cell.n_hi = lo, hi, n_lo, n_hi
    cell.fresh = 0
