"""The agent's in-memory state between sampling and export (no OTel import).

Sampling threads `put()` each source's readings; export callbacks read the latest
value of every series, and for windowed gauges the mean, min and max over the
last export window, so a stall shorter than the export interval stays visible.
Memory is bounded: one value per series plus `window_s / interval_s` samples for
windowed series; series a source stops reporting disappear.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Iterable, Iterator

from .readings import Reading

Attrs = tuple[tuple[str, str], ...]


def attrs_key(attributes) -> Attrs:
    """The series key: attributes in insertion order (sources build them in a fixed order;
    sorting every reading's attributes was the largest cost of a sampling round)."""
    return tuple(attributes.items())


class Store:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._lock = threading.Lock()
        self._latest: dict[str, dict[Attrs, float]] = {}
        self._windows: dict[str, dict[Attrs, deque]] = {}
        self._owned: dict[str, set[tuple[str, Attrs]]] = {}
        self._generation = 0      # bumped by every put: invalidates the window cache
        self._window_cache: dict[str, tuple[int, float, list]] = {}

    def put(self, source: str, readings: Iterable[Reading], now: float) -> None:
        """Replace everything `source` reported before with `readings` taken at `now` (s)."""
        keys = set()
        with self._lock:
            self._generation += 1
            oldest = now - self.window_s
            for r in readings:
                name, key = r.spec.name, tuple(r.attributes.items())
                keys.add((name, key))
                series = self._latest.get(name)
                if series is None:
                    series = self._latest[name] = {}
                series[key] = r.value
                if r.spec.windowed:
                    window = self._windows.setdefault(name, {}).get(key)
                    if window is None:
                        window = self._windows[name][key] = deque()
                    window.append((now, r.value))
                    while window[0][0] < oldest:
                        window.popleft()
            for name, key in self._owned.get(source, set()) - keys:
                self._latest.get(name, {}).pop(key, None)
                self._windows.get(name, {}).pop(key, None)
            self._owned[source] = keys

    def forget(self, source: str) -> None:
        """Drop every series of `source` (it failed as a whole)."""
        self.put(source, (), 0.0)

    def latest(self, name: str) -> Iterator[tuple[float, Attrs]]:
        with self._lock:
            items = list(self._latest.get(name, {}).items())
        for key, value in items:
            yield value, key

    def window(self, name: str, now: float) -> list[tuple[float, float, float, Attrs]]:
        """(mean, min, max, attrs) over samples of the last `window_s` seconds.

        Cached until the next put, so the mean, min and max families of one export
        walk the samples once.
        """
        with self._lock:
            cached = self._window_cache.get(name)
            if cached and cached[0] == self._generation and abs(cached[1] - now) < 0.05:
                return cached[2]
            oldest = now - self.window_s
            rows = []
            for key, w in self._windows.get(name, {}).items():
                values = [v for t, v in w if t >= oldest]
                if values:
                    rows.append((sum(values) / len(values), min(values), max(values), key))
            self._window_cache[name] = (self._generation, now, rows)
            return rows

    def snapshot(self) -> dict[str, dict[Attrs, float]]:
        with self._lock:
            return {name: dict(series) for name, series in self._latest.items()}
