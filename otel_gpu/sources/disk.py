"""Block devices from `<proc_root>/diskstats`, and the filesystems of chosen paths.

diskstats lines have 14 (kernel < 4.18), 18 (+ discards) or 20 (+ flushes) fields:
major minor name, then reads, reads merged, sectors read, ms reading, writes, writes
merged, sectors written, ms writing, I/Os in flight, ms doing I/O, weighted ms, ...
Sectors are always 512 bytes here. The millisecond fields are 32-bit in the kernel's
output and wrap after ~49.7 days; the exported totals stay monotonic across that.
Whole disks only by default: a device with `<sys_root>/class/block/<dev>/partition` is a
partition; loop and ram devices are skipped.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

from .. import names
from ..readings import Reading, SourceError, new_reading
from .net import CounterState
from .procfields import counters, read_text

SECTOR = 512  # bytes
MOD32 = 2**32
_VIRTUAL = re.compile(r"^(loop|ram)\d+$")


class DiskStats(NamedTuple):
    """One diskstats line. Times in milliseconds, sizes in sectors. (A named tuple: the source
    parses every line each round, and it builds in a third of a frozen dataclass's time.)"""

    name: str
    reads: int
    read_sectors: int
    read_ms: int
    writes: int
    write_sectors: int
    write_ms: int
    io_ms: int


@dataclass(frozen=True)
class Mount:
    mountpoint: str
    device: str
    fstype: str


# ---- pure parsers --------------------------------------------------------------------
def parse_diskstats(text: str, bad: list[str] | None = None) -> list[DiskStats]:
    """Parse `/proc/diskstats` (14-, 18- or 20-field lines; shorter lines are skipped). A line
    with a counter that is not a non-negative integer is left out and described in `bad`."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 14:
            continue
        try:
            v = counters(f[3:14])
        except ValueError as e:
            if bad is not None:
                bad.append(f"{f[2]}: {e}")
            continue
        out.append(DiskStats(f[2], v[0], v[2], v[3], v[4], v[6], v[7], v[9]))
    return out


def _unescape(field: str) -> str:
    """mountinfo / mounts escape space, tab, newline and backslash as octal (`\\040`)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _fields(line: str) -> list[str]:
    """Space-separated fields (the kernel escapes space, tab, newline and backslash only)."""
    return [f for f in line.split(" ") if f]


def parse_mountinfo(text: str) -> list[Mount]:
    """`/proc/<pid>/mountinfo` -> mounts (fields after the ` - ` separator: fstype, source)."""
    out = []
    for line in text.split("\n"):   # not splitlines(), nor split(): a path may hold \r or \x85 as is
        left, sep, right = line.partition(" - ")
        f, r = _fields(left), _fields(right)
        if not sep or len(f) < 5 or len(r) < 2:
            continue
        out.append(Mount(_unescape(f[4]), _unescape(r[1]), r[0]))
    return out


def parse_mounts(text: str) -> list[Mount]:
    """`/proc/mounts` (fstab format) -> mounts."""
    out = []
    for line in text.split("\n"):
        f = _fields(line)
        if len(f) >= 3:
            out.append(Mount(_unescape(f[1]), _unescape(f[0]), f[2]))
    return out


def mount_of(path: str, mounts: Iterable[Mount]) -> Mount | None:
    """The mount holding absolute `path`: longest mount-point prefix; the last one wins
    when a mount point is mounted over (later lines are on top)."""
    best: Mount | None = None
    for m in mounts:
        mp = m.mountpoint.rstrip("/") or "/"
        if path == mp or path.startswith(mp if mp == "/" else mp + "/"):
            if best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/"):
                best = m
    return best


def existing_ancestor(path: str) -> str:
    """`path` itself, or its nearest ancestor that exists (a checkpoint folder not made yet)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def fs_usage(st: os.statvfs_result) -> tuple[int, int]:
    """(used, free) bytes as `df` counts them: free is what non-root users may use."""
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    free = st.f_bavail * st.f_frsize
    return used, free


# ---- the source ----------------------------------------------------------------------
_FIELDS = (  # spec, direction, DiskStats field, scale, is a 32-bit ms field
    (names.DISK_IO, "read", "read_sectors", SECTOR, False),
    (names.DISK_IO, "write", "write_sectors", SECTOR, False),
    (names.DISK_OPERATIONS, "read", "reads", 1, False),
    (names.DISK_OPERATIONS, "write", "writes", 1, False),
    (names.DISK_OPERATION_TIME, "read", "read_ms", 1e-3, True),
    (names.DISK_OPERATION_TIME, "write", "write_ms", 1e-3, True),
    (names.DISK_IO_TIME, None, "io_ms", 1e-3, True),
)


class DiskSource:
    """Whole-disk I/O counters (cumulative, monotonic) and filesystem usage of `paths`.

    `paths` are directories whose filesystem to watch (e.g. the checkpoint directory).
    `statvfs` is the filesystem-usage call (`os.statvfs`), a parameter for tests.
    """

    name = "disk"

    def __init__(self, proc_root: str = "/proc", sys_root: str = "/sys", paths: Iterable[str] = (),
                 all_devices: bool = False, statvfs: Callable[[str], os.statvfs_result] = os.statvfs):
        self.proc_root = proc_root
        self.sys_root = sys_root
        self.paths = tuple(os.path.abspath(p) for p in paths)
        self.all_devices = all_devices
        self.statvfs = statvfs
        self.partial_errors = 0
        self.wraps = 0
        self.resets = 0
        self._counters = CounterState()
        self._whole: dict[str, bool] = {}
        self._present: set[str] = set()
        self._mounts: dict[str, Mount | None] = {}
        self._unreadable: dict[str, str] = {}
        self._fs: dict[str, dict] = {}
        self._plans: dict[str, tuple] = {}   # device -> see _plan
        self._diskstats = os.path.join(proc_root, "diskstats")

    # -- block devices
    def _is_whole_disk(self, dev: str) -> bool:
        """Cached: not loop/ram, and not a partition (when /sys says so)."""
        known = self._whole.get(dev)
        if known is None:
            block = os.path.join(self.sys_root, "class", "block")
            known = not _VIRTUAL.match(dev)
            if known and os.path.isdir(block):
                known = not os.path.exists(os.path.join(block, dev.replace("/", "!"), "partition"))
            self._whole[dev] = known
        return known

    def _devices(self) -> list[DiskStats]:
        path = self._diskstats
        bad: list[str] = []
        try:
            stats = parse_diskstats(read_text(path), bad)
        except OSError as e:
            raise SourceError(f"disk: {path}: {e.strerror or e}")
        if self._unreadable:
            self._unreadable.pop(path, None)
            for key in [k for k in self._unreadable if k.startswith(path + " (malformed")]:
                del self._unreadable[key]
        for i, why in enumerate(bad):   # lines left out of this read: each one a partial error
            self.partial_errors += 1
            self._unreadable[f"{path} (malformed line {i + 1})"] = why
        if self.all_devices:
            return stats
        return [s for s in stats if self._is_whole_disk(s.name)]

    def _plan(self, dev: str) -> tuple:
        """A device's exported fields: (DiskStats index, counter key, modulus, scale, spec,
        attributes); built once per device (readings share the attributes: never mutated)."""
        plan = self._plans.get(dev)
        if plan is None:
            rows = []
            for spec, direction, field, scale, ms32 in _FIELDS:
                attrs = {names.DEVICE: dev}
                if direction:
                    attrs[names.DISK_DIRECTION] = direction
                rows.append((DiskStats._fields.index(field), (dev, field), MOD32 if ms32 else None, scale, spec, attrs))
            plan = self._plans[dev] = tuple(rows)
        return plan

    def _device_readings(self, stats: list[DiskStats]) -> list[Reading]:
        out = []
        add, update = out.append, self._counters.update
        for s in stats:
            for index, key, modulus, scale, spec, attrs in self._plan(s.name):
                total, status = update(key, s[index], modulus)
                if status != "ok":
                    if status == "wrap":
                        self.wraps += 1
                    else:
                        self.resets += 1
                        if s.name in self._present:  # a re-added device starts from 0: fine
                            self.partial_errors += 1
                add(new_reading(Reading, (spec, float(total * scale), attrs)))
        return out

    # -- filesystems
    def _mount_table(self) -> list[Mount]:
        for rel, parse in (("self/mountinfo", parse_mountinfo), ("mounts", parse_mounts)):
            path = os.path.join(self.proc_root, rel)
            try:
                return parse(read_text(path))   # as it is: a path may hold \r; a FIFO cannot hold the read
            except OSError as e:
                self._unreadable[path] = e.strerror or str(e)
        return []

    def _fs_readings(self) -> list[Reading]:
        if not self.paths:
            return []
        missing = [p for p in self.paths if p not in self._mounts]
        if missing:  # the mount table is read once per path (mounts rarely change under a job)
            table = self._mount_table()
            for p in missing:
                self._mounts[p] = mount_of(os.path.realpath(existing_ancestor(p)), table)
        out = []
        seen: set[tuple[str, str]] = set()
        for p in self.paths:
            try:
                used, free = fs_usage(self.statvfs(existing_ancestor(p)))
            except OSError as e:
                self.partial_errors += 1
                self._unreadable[p] = e.strerror or str(e)
                continue
            self._unreadable.pop(p, None)
            m = self._mounts[p]
            attrs = {names.DEVICE: m.device, names.MOUNTPOINT: m.mountpoint} if m else {names.MOUNTPOINT: p}
            self._fs[p] = {"path": p, "device": m.device if m else None, "mountpoint": attrs[names.MOUNTPOINT], "fstype": m.fstype if m else None, "used_bytes": used, "free_bytes": free}
            key = (attrs.get(names.DEVICE, ""), attrs[names.MOUNTPOINT])
            if key in seen:  # two paths on one filesystem: one series
                continue
            seen.add(key)
            out.append(Reading(names.FS_USAGE, float(used), {**attrs, names.FS_STATE: "used"}))
            out.append(Reading(names.FS_USAGE, float(free), {**attrs, names.FS_STATE: "free"}))
            if used + free > 0:
                out.append(Reading(names.FS_UTILIZATION, used / (used + free), attrs))
        return out

    # -- Source protocol
    def read(self) -> list[Reading]:
        try:
            stats = self._devices()
        except SourceError as e:
            if not self.paths:
                raise
            self.partial_errors += 1
            self._unreadable[os.path.join(self.proc_root, "diskstats")] = str(e)
            stats = []
        out = self._device_readings(stats)
        present = {s.name for s in stats}
        if present != self._present:
            self._present = present
            for gone in set(self._plans) - present:
                del self._plans[gone]
        fs = self._fs_readings()
        if self.paths and not stats and not fs:
            raise SourceError(f"disk: neither {self.proc_root}/diskstats nor the filesystem of {self.paths[0]} is readable")
        return out + fs

    def describe(self) -> dict:
        error = None
        if not self._present and not self._fs:
            try:
                self.read()
            except SourceError as e:
                error = str(e)
        return {
            "devices": sorted(self._present),
            "skipped": sorted(d for d, whole in self._whole.items() if not whole),
            "partitions_known": os.path.isdir(os.path.join(self.sys_root, "class", "block")),
            "filesystems": [self._fs[p] for p in self.paths if p in self._fs],
            "counter_wraps": self.wraps,
            "counter_resets": self.resets,
            "unreadable": ([error] if error else []) + [f"{p}: {w}" for p, w in sorted(self._unreadable.items())],
        }
