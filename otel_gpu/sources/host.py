"""Host CPU, memory, swap and load, through psutil's interface (a constructor argument for
tests): answered from /proc directly where it is there (hostproc.py), else by psutil.

Nothing here blocks: CPU utilization is computed from the difference of two
`cpu_times()` samples, so the first read has none (there is no earlier sample).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from .. import names
from ..readings import SLOW_READ_S, Reading, SourceError, new_reading
from .hostproc import SWAP_PAGE, ProcHost   # psutil reports swap-in/out as pages * 4096 bytes

CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# attributes of the readings, built once (readings share them: never mutated)
_MODE_ATTRS = {m: {names.CPU_MODE: m} for m in CPU_MODES}
_STATE_ATTRS = {s: {names.MEMORY_STATE: s} for s in ("free", "buffers", "cached", "used")}
_PAGING_ATTRS = {k: {names.PAGING_STATE: k} for k in ("used", "free")}
_DIRECTION_ATTRS = {k: {names.PAGING_DIRECTION: k} for k in ("in", "out")}
_MEMORY_FIELDS = ("total", "available", "free", "buffers", "cached")


# ---- pure computations --------------------------------------------------------------
def cpu_fractions(prev: dict[str, float], cur: dict[str, float]) -> dict[str, float] | None:
    """Share of all CPUs' time per mode between two `cpu_times()` samples (seconds).

    Counters that went backwards (Linux's iowait may) count as 0. None when no time
    passed (two samples within one clock tick).
    """
    deltas = {m: max(cur[m] - prev[m], 0.0) for m in cur if m in prev}
    total = sum(deltas.values())
    if total <= 0:
        return None
    return {m: d / total for m, d in deltas.items()}


def memory_states(vm: Any) -> dict[str, int]:
    """Memory by state (bytes) from `psutil.virtual_memory()`, summing to the total.

    `used` is total - free - buffers - cached (psutil's own `used` is total - available,
    which would count cached pages twice).
    """
    states = {"free": int(vm.free)}
    for state, attr in (("buffers", "buffers"), ("cached", "cached")):
        if hasattr(vm, attr):
            states[state] = int(getattr(vm, attr))
    states["used"] = max(int(vm.total) - sum(states.values()), 0)
    return states


def memory_utilization(vm: Any) -> float:
    """Fraction of memory not available to new work: (total - available) / total."""
    available = getattr(vm, "available", None)
    if available is None:
        available = vm.free
    return (vm.total - available) / vm.total if vm.total else 0.0


def non_negative(sample: Any, fields: tuple[str, ...]) -> Any:
    """`sample` (a psutil named tuple) when each of its `fields` it has is a number >= 0;
    ValueError otherwise (a malformed /proc value is never exported; the read counts as failed)."""
    for f in fields:
        value = getattr(sample, f, 0)
        if not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{f}={value!r}: not a non-negative number")
    return sample


def non_negative_values(values: tuple) -> tuple:
    """`values` (a plain tuple, e.g. load averages) when each is a number >= 0; ValueError otherwise."""
    for i, value in enumerate(values):
        if not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"value {i + 1} = {value!r}: not a non-negative number")
    return values


# ---- the source ------------------------------------------------------------------------
class HostSource:
    """CPU utilization by mode, logical CPUs, memory, swap and 1-minute load."""

    name = "host"

    def __init__(self, psutil_module: Any = None, clock: Callable[[], float] = time.monotonic,
                 proc_root: str = "/proc"):
        """`psutil_module`: psutil or a stand-in (tests); by default its calls are answered from
        `proc_root` directly where it is readable (hostproc.ProcHost), else by psutil."""
        if psutil_module is None:
            if ProcHost.usable(proc_root):
                psutil_module = ProcHost(None, proc_root)   # psutil imported only if /proc lacks something
            else:
                import psutil
                psutil_module = psutil
        self.ps = psutil_module
        self.clock = clock
        self.partial_errors = 0
        self._prev_cpu: dict[str, float] | None = None
        self._failed: dict[str, str] = {}
        self._last: dict[str, Any] = {}
        self._slow: dict[str, tuple[float, Any]] = {}   # what -> (read at, value)

    def _slow_part(self, what: str, fn):
        """`_part`, but answered from the last read for SLOW_READ_S seconds (slow-moving values)."""
        now = self.clock()
        cached = self._slow.get(what)
        if cached is None or now - cached[0] >= SLOW_READ_S:
            cached = self._slow[what] = (now, self._part(what, fn))
        return cached[1]

    def _cpu_times(self) -> dict[str, float]:
        t = non_negative(self.ps.cpu_times(), CPU_MODES)
        return {m: float(getattr(t, m)) for m in CPU_MODES if hasattr(t, m)}

    def _part(self, what: str, fn):
        """Run one psutil call; a failure is a partial error (noted for describe)."""
        try:
            value = fn()
        except (OSError, RuntimeError, AttributeError, ValueError) as e:
            self.partial_errors += 1
            self._failed[what] = f"{type(e).__name__}: {e}"
            return None
        self._failed.pop(what, None)
        return value

    def read(self) -> list[Reading]:
        out: list[Reading] = []
        cpu = self._part("cpu_times", self._cpu_times)
        if cpu is not None:
            if self._prev_cpu is not None:
                fractions = cpu_fractions(self._prev_cpu, cpu)
                if fractions is None:
                    return self._rest(out)  # within one tick: keep the older sample as the base
                out += [new_reading(Reading, (names.CPU_UTILIZATION, f, _MODE_ATTRS[m])) for m, f in fractions.items()]
            self._prev_cpu = cpu
            self._last["cpu_modes"] = sorted(cpu)
        return self._rest(out)

    def _rest(self, out: list[Reading]) -> list[Reading]:
        count = self._slow_part("cpu_count", lambda: self.ps.cpu_count(logical=True))
        if count:
            out.append(Reading(names.CPU_COUNT, float(count)))
        vm = self._part("virtual_memory", lambda: non_negative(self.ps.virtual_memory(), _MEMORY_FIELDS))
        if vm is not None:
            out += [Reading(names.MEMORY_USAGE, float(v), _STATE_ATTRS[s]) for s, v in memory_states(vm).items()]
            out.append(Reading(names.MEMORY_LIMIT, float(vm.total)))
            out.append(Reading(names.MEMORY_UTILIZATION, memory_utilization(vm)))
            self._last["memory_total"] = int(vm.total)
        sw = self._slow_part("swap_memory",   # parses all of /proc/vmstat
                             lambda: non_negative(self.ps.swap_memory(), ("total", "used", "free", "sin", "sout")))
        if sw is not None:
            out.append(Reading(names.PAGING_USAGE, float(sw.used), _PAGING_ATTRS["used"]))
            out.append(Reading(names.PAGING_USAGE, float(sw.free), _PAGING_ATTRS["free"]))
            out.append(Reading(names.PAGING_OPERATIONS, float(sw.sin // SWAP_PAGE), _DIRECTION_ATTRS["in"]))
            out.append(Reading(names.PAGING_OPERATIONS, float(sw.sout // SWAP_PAGE), _DIRECTION_ATTRS["out"]))
            self._last["swap_total"] = int(sw.total)
        load = self._part("getloadavg", lambda: non_negative_values(self.ps.getloadavg()))
        if load is not None:
            out.append(Reading(names.LOAD_1M, float(load[0])))
        if not out and self._failed and len(self._failed) == 5:
            raise SourceError("host: every psutil call failed: " + "; ".join(f"{k}: {v}" for k, v in self._failed.items()))
        return out

    def describe(self) -> dict:
        if not self._last:
            try:
                self.read()
            except SourceError as e:
                return {"unreadable": [str(e)]}
        return {
            "psutil": getattr(self.ps, "__version__", None),
            **self._last,
            "unreadable": [f"{k}: {v}" for k, v in sorted(self._failed.items())],
        }
