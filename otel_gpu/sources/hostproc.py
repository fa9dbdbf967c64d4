"""The two psutil calls the host source makes every round, read from /proc directly (Linux).

`psutil.cpu_times()` and `psutil.virtual_memory()` parse all of `/proc/stat`'s first line and all
of `/proc/meminfo` into Python objects each call (~75 us a round together, half of the host
source); the host source needs ten numbers of them. `ProcHost` reads the same files with one
`os.read` each and gives the same values under the same names (checked against psutil in
tests/sources/test_hostproc.py); the calls made every 10 s or less often go to psutil as before.
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

from .procfields import read_text

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100   # /proc/stat's time unit, Hz
# psutil's scputimes on Linux: /proc/stat's "cpu" line, in this order
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
_MEMINFO_KEYS = ("MemTotal:", "MemFree:", "Buffers:", "Cached:", "SReclaimable:", "MemAvailable:")


class CpuTimes(NamedTuple):
    """System-wide CPU time per mode, seconds (psutil.cpu_times()'s fields on Linux)."""
    user: float
    nice: float
    system: float
    idle: float
    iowait: float
    irq: float
    softirq: float
    steal: float
    guest: float
    guest_nice: float


class Memory(NamedTuple):
    """System memory, bytes, as psutil.virtual_memory() counts it (cached includes SReclaimable)."""
    total: int
    available: int
    free: int
    buffers: int
    cached: int


# ---- pure parsers ----------------------------------------------------------------------
def parse_cpu_times(text: str, clk_tck: int = CLK_TCK) -> CpuTimes | None:
    """The first (`cpu`, all CPUs) line of `/proc/stat` -> seconds per mode. None when the line
    has fewer than the 10 modes (kernels before 2.6.33: psutil then gives fewer fields; the caller
    asks it). ValueError when a field is not a number, IndexError when there is no such line."""
    end = text.find("\n")
    fields = (text if end < 0 else text[:end]).split()
    if not fields or fields[0] != "cpu":
        raise IndexError(f"no 'cpu' line first: {text[:60]!r}")
    if len(fields) <= len(CPU_FIELDS):
        return None
    return CpuTimes(*[float(x) / clk_tck for x in fields[1:len(CPU_FIELDS) + 1]])


def parse_meminfo(text: str) -> Memory | None:
    """`/proc/meminfo` -> the five sizes the host source exports (bytes), computed as psutil does.
    None when MemTotal, MemFree or a usable MemAvailable is missing (psutil then estimates what is
    available: the caller asks it). ValueError when a value it needs is not a number."""
    found = {}
    for key in _MEMINFO_KEYS:
        at = text.find(key)
        while at > 0 and text[at - 1] != "\n":   # a key is at the start of a line
            at = text.find(key, at + 1)
        if at >= 0:
            end = text.find("\n", at)
            rest = text[at + len(key):end if end >= 0 else len(text)].split()
            if not rest:
                raise ValueError(f"{key} has no value")
            found[key] = int(rest[0]) * 1024
    total, free, available = found.get("MemTotal:"), found.get("MemFree:"), found.get("MemAvailable:")
    if total is None or free is None or not available:
        return None
    if available > total:
        available = free
    cached = found.get("Cached:")
    cached = 0 if cached is None else cached + found.get("SReclaimable:", 0)
    return Memory(total, available, free, found.get("Buffers:", 0), cached)


# ---- psutil's interface, for the host source -----------------------------------------------
class ProcHost:
    """`cpu_times()` and `virtual_memory()` from `<proc_root>/stat` and `<proc_root>/meminfo`; every
    other attribute (cpu_count, swap_memory, getloadavg, __version__) is `psutil_module`'s."""

    def __init__(self, psutil_module: Any, proc_root: str = "/proc"):
        self._ps = psutil_module
        self._stat = os.path.join(proc_root, "stat")
        self._meminfo = os.path.join(proc_root, "meminfo")

    def cpu_times(self) -> Any:
        times = parse_cpu_times(read_text(self._stat))
        return times if times is not None else self._ps.cpu_times()   # an old kernel: psutil's fields

    def virtual_memory(self) -> Any:
        memory = parse_meminfo(read_text(self._meminfo))
        return memory if memory is not None else self._ps.virtual_memory()   # psutil's estimate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ps, name)

    @staticmethod
    def usable(proc_root: str = "/proc") -> bool:
        """True where `<proc_root>/stat` and `<proc_root>/meminfo` can be read (Linux)."""
        try:
            read_text(os.path.join(proc_root, "stat"))
            read_text(os.path.join(proc_root, "meminfo"))
        except OSError:
            return False
        return True
