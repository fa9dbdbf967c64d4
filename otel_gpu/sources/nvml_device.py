"""One NVML device as `NvmlSource` sees it, and calling NVML on it.

A `Device` holds a GPU's (or MIG device's) handle, identity attributes, what it cannot do
(probed once), its measured call costs and the state of its costly fields. `call()` makes one
NVML call on it: a NOT_SUPPORTED answer is remembered and the call never made again, a lost
GPU raises `DeviceLost`, any other error is counted and the field skipped this time.
No import of nvml.py or nvml_costs.py: they import this.
"""
from __future__ import annotations

import functools
import re
from typing import Callable

import pynvml

from .. import names as N
from ..readings import Reading
from . import gpm as gpm_mod
from . import nvml_errors as E
from .gpu_owner import Labels
from .nvml_cadence import CallCost, SlowField, timed

KIB = 1024
MIB = 1024 * 1024
MIG_RESCAN_S = 30.0         # seconds between listings of a MIG-mode GPU's MIG devices
SKIP = object()             # what `call` returns for a field not read this time
CLOCK_FNS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")

# NVML clock-event (throttle) reason bits -> snake_case reason names.
CLOCK_REASONS = {0x001: "gpu_idle", 0x002: "applications_clocks_setting", 0x004: "sw_power_cap",
                 0x008: "hw_slowdown", 0x010: "sync_boost", 0x020: "sw_thermal_slowdown",
                 0x040: "hw_thermal_slowdown", 0x080: "hw_power_brake", 0x100: "display_clock_setting"}


def clock_reason_values(mask: int) -> dict[str, int]:
    """Every known reason -> 1 if its bit is set in `mask`, else 0; unknown set bits as `bit_<n>`."""
    return dict(clock_reason_items(mask))


@functools.lru_cache(maxsize=64)
def clock_reason_items(mask: int) -> tuple[tuple[str, int], ...]:
    """`clock_reason_values` as items, computed once per mask (masks rarely change)."""
    out = [(name, int(bool(mask & bit))) for bit, name in CLOCK_REASONS.items()]
    rest = mask & ~sum(CLOCK_REASONS)
    while rest:
        low = rest & -rest
        out.append((f"bit_{low.bit_length() - 1}", 1))
        rest ^= low
    return tuple(out)


def mig_profile(name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3 MIG 1g.10gb' -> '1g.10gb' (None when not a MIG name)."""
    m = re.search(r"\bMIG\s+(\S+)\s*$", name)
    return m.group(1) if m else None


def text(v) -> str:
    """An NVML string (bytes in older bindings) as str."""
    return v.decode() if isinstance(v, bytes) else str(v)


class DeviceLost(Exception):
    """The GPU is gone (GPU_IS_LOST and the like): it is marked failed and no longer read."""


class Device:
    """One GPU (or MIG device): its handle, identity and what it cannot do."""

    def __init__(self, index, handle, uuid, name, parent=None):
        self.index, self.handle, self.uuid, self.name, self.parent = index, handle, uuid, name, parent
        self.failed: str | None = None
        self.unsupported: dict[str, str] = {}   # field -> reason (probed once)
        self.errors: dict[str, str] = {}        # field -> last transient error
        self.probed = False
        self.mig_mode: str = "unknown"
        self.migs: list[Device] = []
        self.migs_listed_at = 0.0   # monotonic s
        self.nvlink = False
        self.gpm: gpm_mod.GpmDevice | None = None
        self.gpm_status = "not probed"
        self.gpm_out: list[Reading] = []           # readings of the last GPM computation
        self.clock_fn = CLOCK_FNS[0]
        self.xid: dict[int, int] = {}
        self.pcie_bytes = {"transmit": 0.0, "receive": 0.0}   # direction -> bytes since the first read
        self.pcie_last: dict[str, tuple[float, float]] = {}   # direction -> (last KB/s sample, its time)
        self.gpm_seen = 0                          # GPM computations already integrated into pcie_bytes
        self.costs: dict[str, CallCost] = {}       # field -> its measured call cost
        self.settled: set[str] = set()             # fields whose cost is known: no longer timed
        self.bound: dict[str, Callable] = {}        # NVML function name -> the function (settled fields')
        self.costly: dict[str, SlowField] = {}     # costly fields, read apart from the sampling round
        self.lost_pending: str | None = None       # lost, as found by a background read
        self.slow: tuple[float, list[Reading]] | None = None   # (read at, readings) of the rarely changing fields
        self.memory_total: float | None = None   # bytes, as last read (doctor's consistency check)
        self.by_mask: dict[int, list[Reading]] = {}   # clock-event mask -> its readings
        self.status: dict[int, tuple[Reading, Reading]] = {}   # 1 ok / 0 failed -> its hw.status readings
        self.proc_attrs: dict[tuple, dict[str, str]] = {}   # (pid, (exe, rank, owner)) -> its readings' attributes
        self.nvlinks = 0                            # NVLink count (probed)
        self.dead_links: set[int] = set()           # NVLink links that answer no error counter
        self.labels = Labels()                      # the job using it (gpu_owner.py), set by each process listing
        self.attrs = {N.HW_ID: uuid, N.HW_NAME: name, N.HW_VENDOR: "nvidia", N.HW_TYPE: "gpu",
                      N.GPU_INDEX: str(index)}
        if parent is not None:
            self.attrs[N.HW_PARENT] = parent.uuid
            profile = mig_profile(name)
            if profile:
                self.attrs[N.MIG_PROFILE] = profile
        self._tagged: dict[tuple[str, str], dict[str, str]] = {}
        # the attributes a round uses every time, looked up once
        self.task_attrs = self.tagged(N.GPU_TASK, "general")
        self.clock_attrs = (self.tagged(N.CLOCK_DOMAIN, "sm"), self.tagged(N.CLOCK_DOMAIN, "memory"))
        self.direction_attrs = {d: self.tagged(N.DIRECTION, d) for d in ("transmit", "receive")}
        self.gpm_plan: tuple | None = None   # how its GPM values become readings (gpm.reading_plan)

    def link_attrs(self, link: int, counter: str) -> dict[str, str]:
        """`attrs` plus an NVLink link and an error counter, built once (never mutate it)."""
        attrs = self._tagged.get((link, counter))
        if attrs is None:
            attrs = self._tagged[(link, counter)] = {**self.attrs, N.NVLINK_LINK: str(link), N.ERROR_TYPE: counter}
        return attrs

    def tagged(self, key: str, value: str) -> dict[str, str]:
        """`attrs` plus one attribute, built once (readings share it: never mutate it)."""
        attrs = self._tagged.get((key, value))
        if attrs is None:
            attrs = self._tagged[(key, value)] = {**self.attrs, key: value}
        return attrs


def call(nvml, on_error: Callable[[], None], dev: Device, field: str, fn_name: str, *args):
    """`nvml.<fn_name>(*args)` for `field` of `dev`, or SKIP when unsupported (remembered) or
    failing now (`on_error()` counts it). Timed until the field's cost is known (costly fields:
    always). Raises DeviceLost when the GPU is gone. (`nvml` and `on_error` first: a source binds
    them once with functools.partial, which adds no Python frame to each call.)"""
    if field in dev.unsupported:
        return SKIP
    fn = dev.bound.get(fn_name)   # a settled field's function, looked up once
    try:
        if fn is not None and field in dev.settled:
            value = fn(*args)
        else:
            fn = getattr(nvml, fn_name, None)
            if fn is None:
                dev.unsupported[field] = f"{fn_name} not in this NVML binding"
                return SKIP
            value = timed(dev.costs, field, fn_name, fn, *args)
            if dev.costs[field].known and field not in dev.costly:
                dev.settled.add(field)
                dev.bound[fn_name] = fn
    except pynvml.NVMLError as err:
        kind = E.classify(err)
        if kind == E.LOST:
            raise DeviceLost(E.describe_error(err)) from None
        if kind == E.UNSUPPORTED:
            dev.unsupported[field] = E.describe_error(err)
        else:
            dev.errors[field] = E.describe_error(err)
            on_error()
        return SKIP
    if dev.errors:
        dev.errors.pop(field, None)
    return value
