"""Per-process CPU, resident memory and storage I/O of the training processes.

On Linux everything comes from `<proc_root>/<pid>/stat` (CPU time, RSS, start time)
and `<proc_root>/<pid>/io` (bytes that reached the storage layer; needs the same user or
CAP_SYS_PTRACE). Where `proc_root` does not exist (not Linux), psutil is used instead.
Processes that exit between reads are dropped without counting an error.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .. import names
from ..readings import Reading
from .procenv import rank_of
from .procfields import counter

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # stat's time unit, Hz
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096  # bytes
MALFORMED = "malformed: "   # a describe() note for an io file with fields left out


@dataclass(frozen=True)
class ProcStat:
    """What `/proc/<pid>/stat` says: comm, CPU seconds (user + system), start time
    (clock ticks since boot: with the PID, it names one process) and RSS (bytes)."""

    comm: str
    cpu_s: float
    start_ticks: int
    rss_bytes: int


# ---- pure parsers ---------------------------------------------------------------------
def parse_stat(text: str, clk_tck: int = CLK_TCK, page_size: int = PAGE_SIZE) -> ProcStat:
    """Parse `/proc/<pid>/stat`. The comm may hold spaces and parentheses, so fields are
    counted from the last ')'."""
    open_, close = text.index("("), text.rindex(")")
    rest = text[close + 2:].split()  # rest[0] is field 3 (state)
    utime, stime = counter(rest[11]), counter(rest[12])   # ValueError when negative or not a number
    return ProcStat(text[open_ + 1:close], (utime + stime) / clk_tck, counter(rest[19]), counter(rest[21]) * page_size)


def parse_io(text: str, bad: list[str] | None = None) -> dict[str, int]:
    """Parse `/proc/<pid>/io` ("read_bytes: 4096" lines) into a dict (bytes, calls). A field that is
    not a non-negative integer is left out and described in `bad`."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            try:
                out[key.strip()] = counter(value)
            except ValueError as e:
                if bad is not None:
                    bad.append(f"{key.strip()}: {e}")
    return out


def cmdline_matches(cmdline: bytes, patterns: Iterable[str]) -> bool:
    """True when any pattern is a substring of the NUL-separated command line."""
    text = cmdline.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return bool(text) and any(p in text for p in patterns)


def find_pids(patterns: Iterable[str], proc_root: str = "/proc", exclude_self: bool = True) -> list[int]:
    """PIDs whose command line contains one of `patterns` (the agent itself excluded)."""
    patterns = [p for p in patterns if p]
    if not patterns:
        return []
    me = os.getpid() if exclude_self else -1
    out = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(os.path.join(proc_root, entry, "cmdline"), "rb") as f:
                cmdline = f.read()
        except OSError:
            continue  # exited, or not ours to read
        if cmdline_matches(cmdline, patterns):
            out.append(int(entry))
    return sorted(out)


class PidFinder:
    """A `pids` callable: explicit PIDs plus processes found by command-line substring,
    rescanned at most every `rescan_s` seconds (a scan reads every process's cmdline)."""

    def __init__(self, patterns: Iterable[str] = (), pids: Iterable[int] = (), proc_root: str = "/proc",
                 rescan_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.patterns = tuple(patterns)
        self.pids = tuple(pids)
        self.proc_root = proc_root
        self.rescan_s = rescan_s
        self.clock = clock
        self._found: list[int] = []
        self._at: float | None = None

    def __call__(self) -> list[int]:
        now = self.clock()
        if self.patterns and (self._at is None or now - self._at >= self.rescan_s):
            self._found = find_pids(self.patterns, self.proc_root)
            self._at = now
        return sorted(set(self.pids) | set(self._found))


# ---- the source -------------------------------------------------------------------------
@dataclass
class _Tracked:
    start: int | float
    executable: str
    rank: str | None
    cpu_s: float | None = None
    at: float | None = None
    io: dict = field(default_factory=dict)


class ProcessSource:
    """CPU utilization (can exceed 1), RSS and disk I/O for each PID `pids()` returns."""

    name = "process"

    def __init__(self, pids: Callable[[], Iterable[int]], proc_root: str = "/proc",
                 psutil_module: Any = None, clock: Callable[[], float] = time.monotonic):
        """`psutil_module`: psutil or a stand-in, used only where `proc_root` does not exist
        (imported then: the node agent on Linux never loads it)."""
        self.pids = pids
        self.proc_root = proc_root
        self._ps = psutil_module
        self.clock = clock
        self.partial_errors = 0
        self._tracked: dict[int, _Tracked] = {}
        self._no_io: dict[int, str] = {}
        self._gone = 0

    @classmethod
    def by_name(cls, patterns: Iterable[str], pids: Iterable[int] = (), proc_root: str = "/proc",
                rescan_s: float = 5.0, **kwargs) -> "ProcessSource":
        """A source for processes whose command line contains one of `patterns`."""
        return cls(PidFinder(patterns, pids, proc_root, rescan_s), proc_root=proc_root, **kwargs)

    # -- one process, Linux
    def _sample_proc(self, pid: int) -> tuple[Any, float, int, dict | None, str]:
        """(start, cpu seconds, rss bytes, io dict or None, comm); raises FileNotFoundError when gone."""
        base = os.path.join(self.proc_root, str(pid))
        with open(os.path.join(base, "stat")) as f:
            st = parse_stat(f.read())
        io = None
        bad: list[str] = []
        try:
            with open(os.path.join(base, "io")) as f:
                io = parse_io(f.read(), bad)
            if bad:   # fields left out: a partial error, shown by describe() until a clean read
                self.partial_errors += 1
                self._no_io[pid] = MALFORMED + "; ".join(bad)
            elif self._no_io.get(pid, "").startswith(MALFORMED):
                del self._no_io[pid]
        except FileNotFoundError:
            self._no_io[pid] = "no io file (kernel without task I/O accounting)"
        except PermissionError as e:
            self._no_io[pid] = e.strerror or "permission denied"
        except (OSError, ValueError) as e:
            self.partial_errors += 1
            self._no_io[pid] = getattr(e, "strerror", None) or str(e)
        return st.start_ticks, st.cpu_s, st.rss_bytes, io, st.comm

    def _executable(self, pid: int, comm: str) -> str:
        """Base name of /proc/<pid>/exe (comm is cut at 15 characters); comm when unreadable."""
        try:
            return os.path.basename(os.readlink(os.path.join(self.proc_root, str(pid), "exe"))).removesuffix(" (deleted)")
        except OSError:
            return comm

    # -- one process, psutil (no /proc)
    @property
    def ps(self) -> Any:
        if self._ps is None:
            import psutil
            self._ps = psutil
        return self._ps

    def _sample_psutil(self, pid: int) -> tuple[Any, float, int, dict | None, str]:
        try:
            p = self.ps.Process(pid)
            with p.oneshot():
                t = p.cpu_times()
                rss = p.memory_info().rss
                name = p.name()
                start = p.create_time()
                io = None
                if hasattr(p, "io_counters"):
                    try:
                        c = p.io_counters()
                        io = {"read_bytes": c.read_bytes, "write_bytes": c.write_bytes}
                    except self.ps.AccessDenied:
                        self._no_io[pid] = "permission denied"
        except self.ps.NoSuchProcess:
            raise FileNotFoundError(pid)
        return start, t.user + t.system, rss, io, name

    def read(self) -> list[Reading]:
        use_proc = os.path.isdir(self.proc_root)
        now = self.clock()
        out: list[Reading] = []
        wanted = set()
        for pid in self.pids():
            pid = int(pid)
            wanted.add(pid)
            try:
                start, cpu_s, rss, io, comm = (self._sample_proc if use_proc else self._sample_psutil)(pid)
            except (FileNotFoundError, ProcessLookupError):
                self._forget(pid)
                continue
            except (OSError, ValueError, IndexError):
                self.partial_errors += 1  # a stat file we cannot read or parse
                continue
            t = self._tracked.get(pid)
            if t is None or t.start != start:  # new process, or the PID was reused
                t = _Tracked(start, self._executable(pid, comm) if use_proc else comm,
                             rank_of(pid, self.proc_root) if use_proc else None)
                self._tracked[pid] = t
            attrs = {names.PID: str(pid), names.EXECUTABLE: t.executable}
            if t.rank is not None:
                attrs[names.RANK] = t.rank
            if t.cpu_s is not None and now > t.at:
                out.append(Reading(names.PROCESS_CPU_UTILIZATION, max(cpu_s - t.cpu_s, 0.0) / (now - t.at), attrs))
            t.cpu_s, t.at = cpu_s, now
            out.append(Reading(names.PROCESS_MEMORY, float(rss), attrs))
            if io is not None:
                if not self._no_io.get(pid, "").startswith(MALFORMED):
                    self._no_io.pop(pid, None)
                for direction, key in (("read", "read_bytes"), ("write", "write_bytes")):
                    if key in io:
                        out.append(Reading(names.PROCESS_DISK_IO, float(io[key]), {**attrs, names.DISK_DIRECTION: direction}))
        for pid in set(self._tracked) - wanted:
            self._forget(pid)
        return out

    def _forget(self, pid: int) -> None:
        if self._tracked.pop(pid, None) is not None:
            self._gone += 1
        self._no_io.pop(pid, None)

    def describe(self) -> dict:
        if not self._tracked:
            self.read()
        return {
            "proc_root": self.proc_root if os.path.isdir(self.proc_root) else None,
            "processes": [{"pid": pid, "executable": t.executable, "rank": t.rank}
                          for pid, t in sorted(self._tracked.items())],
            "exited": self._gone,
            "unreadable": [f"{self.proc_root}/{pid}/io: {why}" for pid, why in sorted(self._no_io.items())],
        }
