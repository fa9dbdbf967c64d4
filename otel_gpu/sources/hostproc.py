"""The psutil calls the host source makes, read from /proc directly (Linux).

`psutil.cpu_times()` and `psutil.virtual_memory()` parse all of `/proc/stat`'s first line and all
of `/proc/meminfo` into Python objects each call (~75 us a round together, half of the host
source); the host source needs ten numbers of them. `ProcHost` reads the same files with one
`os.read` each and gives the same values under the same names (checked against psutil in
tests/sources/test_hostproc.py). Swap (every 10 s), the CPU count and the load average come the way
psutil gets them too, so the node agent never imports psutil (~1.7 MB resident) where /proc has
what it needs; psutil answers only what /proc lacks (old kernels, exotic ones).
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

from .procfields import read_text

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100   # /proc/stat's time unit, Hz
# psutil's scputimes on Linux: /proc/stat's "cpu" line, in this order
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
_MEMINFO_KEYS = ("MemTotal:", "MemFree:", "Buffers:", "Cached:", "SReclaimable:", "MemAvailable:")
_SWAP_KEYS = ("SwapTotal:", "SwapFree:")
SWAP_PAGE = 4096   # /proc/vmstat's pswpin and pswpout count 4 KiB pages (psutil's factor)


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


class Swap(NamedTuple):
    """Swap space (bytes) and pages swapped in and out since boot (bytes, x 4096), as
    psutil.swap_memory() gives them on Linux."""
    total: int
    used: int
    free: int
    sin: int
    sout: int


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
    found = {key: kib * 1024 for key, kib in _values(text, _MEMINFO_KEYS).items()}
    total, free, available = found.get("MemTotal:"), found.get("MemFree:"), found.get("MemAvailable:")
    if total is None or free is None or not available:
        return None
    if available > total:
        available = free
    cached = found.get("Cached:")
    cached = 0 if cached is None else cached + found.get("SReclaimable:", 0)
    return Memory(total, available, free, found.get("Buffers:", 0), cached)


def parse_swap(meminfo: str, vmstat: str) -> Swap | None:
    """`/proc/meminfo`'s SwapTotal and SwapFree and `/proc/vmstat`'s pswpin and pswpout -> `Swap`,
    computed as psutil does. None when one of them is missing (psutil then asks the kernel
    another way or gives 0: the caller asks it). ValueError when a value is not a number."""
    sizes = _values(meminfo, _SWAP_KEYS)
    pages = _values(vmstat, ("pswpin ", "pswpout "))
    if len(sizes) < 2 or len(pages) < 2:
        return None
    total, free = sizes["SwapTotal:"] * 1024, sizes["SwapFree:"] * 1024
    return Swap(total, total - free, free, pages["pswpin "] * SWAP_PAGE, pages["pswpout "] * SWAP_PAGE)


def _values(text: str, keys: tuple[str, ...]) -> dict[str, int]:
    """{key: the integer after it} for each of `keys` found at the start of a line of `text`."""
    found = {}
    for key in keys:
        at = text.find(key)
        while at > 0 and text[at - 1] != "\n":   # a key is at the start of a line
            at = text.find(key, at + 1)
        if at >= 0:
            end = text.find("\n", at)
            rest = text[at + len(key):end if end >= 0 else len(text)].split()
            if not rest:
                raise ValueError(f"{key.strip()} has no value")
            found[key] = int(rest[0])
    return found


# ---- psutil's interface, for the host source -----------------------------------------------
class ProcHost:
    """psutil's `cpu_times()`, `virtual_memory()`, `swap_memory()`, `cpu_count()` and
    `getloadavg()` from `<proc_root>` and the OS, as psutil computes them on Linux; psutil itself
    (`psutil_module`, imported on first need when None) answers what /proc lacks, and any other
    attribute (`__version__`)."""

    def __init__(self, psutil_module: Any = None, proc_root: str = "/proc"):
        self._ps = psutil_module
        self._stat = os.path.join(proc_root, "stat")
        self._meminfo = os.path.join(proc_root, "meminfo")
        self._vmstat = os.path.join(proc_root, "vmstat")

    @property
    def psutil(self) -> Any:
        if self._ps is None:
            import psutil   # only for what /proc does not answer, or its version (doctor)
            self._ps = psutil
        return self._ps

    def cpu_times(self) -> Any:
        times = parse_cpu_times(read_text(self._stat))
        return times if times is not None else self.psutil.cpu_times()   # an old kernel: psutil's fields

    def virtual_memory(self) -> Any:
        memory = parse_meminfo(read_text(self._meminfo))
        return memory if memory is not None else self.psutil.virtual_memory()   # psutil's estimate

    def swap_memory(self) -> Any:
        try:
            vmstat = read_text(self._vmstat)
        except OSError:
            vmstat = ""   # psutil then warns and counts no pages swapped, as before
        swap = parse_swap(read_text(self._meminfo), vmstat)
        return swap if swap is not None else self.psutil.swap_memory()

    def cpu_count(self, logical: bool = True) -> int | None:
        if logical:
            try:
                return os.sysconf("SC_NPROCESSORS_ONLN")   # what psutil asks first
            except (ValueError, OSError):
                pass
        return self.psutil.cpu_count(logical=logical)

    @staticmethod
    def getloadavg() -> tuple[float, float, float]:
        return os.getloadavg()   # psutil's getloadavg on Linux is this function

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") and name != "__version__":
            raise AttributeError(name)   # no psutil import for a probe of a private name
        return getattr(self.psutil, name)

    @staticmethod
    def usable(proc_root: str = "/proc") -> bool:
        """True where `<proc_root>/stat` and `<proc_root>/meminfo` can be read (Linux)."""
        try:
            read_text(os.path.join(proc_root, "stat"))
            read_text(os.path.join(proc_root, "meminfo"))
        except OSError:
            return False
        return True
