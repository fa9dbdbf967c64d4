"""Time in Python's garbage collector, per generation, from `gc.callbacks`.

The callback runs inside every collection (the collecting thread holds the GIL): on "start" it keeps a
`perf_counter_ns()`, on "stop" it adds the elapsed nanoseconds and one collection to its generation's
slot. Two integer operations and one clock read per phase: about 0.3 us a collection (bench/bench_gc.py).
"""
from __future__ import annotations

import gc
from time import perf_counter_ns

GENERATIONS = ("0", "1", "2")


class GcClock:
    """Nanoseconds and collections per generation (0, 1, 2) since `install()`."""

    def __init__(self):
        self.ns = [0, 0, 0]         # nanoseconds inside collections of each generation
        self.count = [0, 0, 0]      # collections of each generation
        self._t0 = 0

    def callback(self, phase, info, _now=perf_counter_ns):
        if phase == "start":
            self._t0 = _now()
        else:   # "stop": the same collection's end (collections never nest)
            g = info["generation"]
            self.ns[g] += _now() - self._t0
            self.count[g] += 1

    def install(self) -> None:
        if self.callback not in gc.callbacks:
            gc.callbacks.append(self.callback)

    def uninstall(self) -> None:
        while self.callback in gc.callbacks:
            gc.callbacks.remove(self.callback)

    def restart(self) -> None:
        """Count from now (the first step): what set-up collected is left out."""
        self.ns[:] = [0, 0, 0]
        self.count[:] = [0, 0, 0]

    def seconds(self) -> dict[str, float]:
        """Generation ("0", "1", "2") -> seconds in the collector since `install()`."""
        return {g: ns / 1e9 for g, ns in zip(GENERATIONS, list(self.ns))}

    def collections(self) -> dict[str, int]:
        return dict(zip(GENERATIONS, list(self.count)))
