"""NVIDIA GPUs through NVML: utilization, memory, power, energy, temperature, clocks,
clock-event reasons, ECC and XID errors, PCIe and NVLink bytes, per-process memory,
MIG devices, and GPM metrics on Hopper and newer (see gpm.py).

The NVML module is a constructor argument: the real `pynvml` or a `FakeNvml`.
Capabilities are probed once per device: a call answered NOT_SUPPORTED is never
made again and its metric is left out (never reported as 0). A GPU that is lost
is marked failed (`hw.status`) and no longer read; the other GPUs keep reporting.
"""
from __future__ import annotations

import functools
import os
import re
import time

import pynvml

from .. import names as N
from ..readings import SLOW_READ_S, Reading, SourceError
from . import gpm as gpm_mod
from . import nvml_errors as E
from .procenv import rank_of

KIB = 1024
PCIE_MIN_INTERVAL_S = 1.0   # seconds between nvmlDeviceGetPcieThroughput calls per device
MIG_RESCAN_S = 30.0         # seconds between listings of a MIG-mode GPU's MIG devices
_SKIP = object()
FIELDS = ("utilization", "memory", "power", "power_limit", "energy", "temperature", "clock_sm", "clock_memory",
          "clock_events", "ecc_corrected", "ecc_uncorrected", "pcie_transmit", "pcie_receive", "nvlink",
          "processes", "xid", "mig")  # metric groups, as describe() names them
_CLOCK_FNS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
_VALUE_FIELD = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}  # by valueType

# NVML clock-event (throttle) reason bits -> snake_case reason names.
CLOCK_REASONS = {0x001: "gpu_idle", 0x002: "applications_clocks_setting", 0x004: "sw_power_cap",
                 0x008: "hw_slowdown", 0x010: "sync_boost", 0x020: "sw_thermal_slowdown",
                 0x040: "hw_thermal_slowdown", 0x080: "hw_power_brake", 0x100: "display_clock_setting"}


def clock_reason_values(mask: int) -> dict[str, int]:
    """Every known reason -> 1 if its bit is set in `mask`, else 0; unknown set bits as `bit_<n>`."""
    return dict(_clock_reason_items(mask))


@functools.lru_cache(maxsize=64)
def _clock_reason_items(mask: int) -> tuple[tuple[str, int], ...]:
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


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class _DeviceLost(Exception):
    pass


class _Device:
    """One GPU (or MIG device): its handle, identity and what it cannot do."""

    def __init__(self, index, handle, uuid, name, parent=None):
        self.index, self.handle, self.uuid, self.name, self.parent = index, handle, uuid, name, parent
        self.failed: str | None = None
        self.unsupported: dict[str, str] = {}   # field -> reason (probed once)
        self.errors: dict[str, str] = {}        # field -> last transient error
        self.probed = False
        self.mig_mode: str = "unknown"
        self.migs: list[_Device] = []
        self.migs_listed_at = 0.0   # monotonic s
        self.nvlink = False
        self.gpm: gpm_mod.GpmDevice | None = None
        self.gpm_status = "not probed"
        self.clock_fn = _CLOCK_FNS[0]
        self.xid: dict[int, int] = {}
        self.pcie: dict[str, list[float]] = {}   # direction -> [bytes total, last KB/s, last t]
        self.slow: tuple[float, list[Reading]] | None = None   # (read at, readings) of _slow()
        self.by_mask: dict[int, list[Reading]] = {}   # clock-event mask -> its readings
        self.attrs = {N.HW_ID: uuid, N.HW_NAME: name, N.HW_VENDOR: "nvidia", N.HW_TYPE: "gpu",
                      N.GPU_INDEX: str(index)}
        if parent is not None:
            self.attrs[N.HW_PARENT] = parent.uuid
            profile = mig_profile(name)
            if profile:
                self.attrs[N.MIG_PROFILE] = profile
        self._tagged: dict[tuple[str, str], dict[str, str]] = {}

    def tagged(self, key: str, value: str) -> dict[str, str]:
        """`attrs` plus one attribute, built once (readings share it: never mutate it)."""
        attrs = self._tagged.get((key, value))
        if attrs is None:
            attrs = self._tagged[(key, value)] = {**self.attrs, key: value}
        return attrs


class NvmlSource:
    """Reads every NVIDIA GPU through `nvml` (module `pynvml` or a `FakeNvml`).

    `proc_root` is where process ranks and names are read; `clock` returns seconds
    (monotonic) and times PCIe integration and GPM sampling; `gpm=False` turns GPM off.
    Raises `SourceError` (one line) when NVML cannot start or finds no GPU.
    """

    name = "nvml"

    def __init__(self, nvml=pynvml, proc_root: str = "/proc", clock=time.monotonic, gpm: bool = True):
        self._nvml, self._proc_root, self._clock, self._gpm_on = nvml, proc_root, clock, gpm
        self.partial_errors = 0
        self._pids: set[int] = set()
        self._proc_cache: dict[int, tuple[str, str | None]] = {}
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise SourceError(E.init_error_line(err)) from None
        self._closed = False
        try:
            self.driver = _text(nvml.nvmlSystemGetDriverVersion())
            count = nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            self.close()
            raise SourceError(f"NVML started but could not list GPUs ({E.describe_error(err)}): GPU metrics are off") from None
        if count == 0:
            self.close()
            raise SourceError("NVML found no NVIDIA GPU: GPU metrics are off")
        self.devices = [self._open(i) for i in range(count)]
        self._by_handle = {E.handle_key(d.handle): d for d in self.devices if d.handle is not None}
        self._xid = E.XidEvents(nvml)

    def _open(self, i: int) -> _Device:
        nvml = self._nvml
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            dev = _Device(i, h, _text(nvml.nvmlDeviceGetUUID(h)), _text(nvml.nvmlDeviceGetName(h)))
        except pynvml.NVMLError as err:
            dev = _Device(i, None, f"nvidia-gpu-index-{i}", "unknown NVIDIA GPU")
            dev.failed = E.describe_error(err)
            self.partial_errors += 1
        return dev

    # ---- calling NVML ----------------------------------------------------------
    def _call(self, dev: _Device, field: str, fn_name: str, *args):
        """`nvml.<fn_name>(*args)`, or _SKIP when unsupported (remembered) or failing now."""
        if field in dev.unsupported:
            return _SKIP
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            dev.unsupported[field] = f"{fn_name} not in this NVML binding"
            return _SKIP
        try:
            value = fn(*args)
        except pynvml.NVMLError as err:
            kind = E.classify(err)
            if kind == E.LOST:
                raise _DeviceLost(E.describe_error(err)) from None
            if kind == E.UNSUPPORTED:
                dev.unsupported[field] = E.describe_error(err)
            else:
                dev.errors[field] = E.describe_error(err)
                self.partial_errors += 1
            return _SKIP
        if dev.errors:
            dev.errors.pop(field, None)
        return value

    # ---- the Source protocol -------------------------------------------------
    def read(self) -> list[Reading]:
        """One reading of every GPU (MIG devices included); lost GPUs report only hw.status."""
        now = self._clock()
        out: list[Reading] = []
        pids: set[int] = set()
        failed_waits = self._xid.errors
        for key, code in self._xid.drain():
            dev = self._by_handle.get(key)
            if dev is not None:
                dev.xid[code] = dev.xid.get(code, 0) + 1
        self.partial_errors += self._xid.errors - failed_waits
        for dev in self.devices:
            if not dev.failed:
                try:
                    if not dev.probed:
                        self._probe(dev)
                    out.extend(self._read_device(dev, now, pids))
                except _DeviceLost as lost:
                    self._mark_lost(dev, str(lost))
            out.extend(self._status(dev))
        self._pids = pids
        self._proc_cache = {p: v for p, v in self._proc_cache.items() if p in pids}
        return out

    def gpu_pids(self) -> set[int]:
        """PIDs using a GPU in the last read."""
        return set(self._pids)

    def _mark_lost(self, dev: _Device, reason: str) -> None:
        dev.failed = reason
        self.partial_errors += 1
        if dev.gpm is not None:
            dev.gpm.close()
            dev.gpm = None

    def _status(self, dev: _Device) -> tuple[Reading, Reading]:
        ok = 0 if dev.failed else 1
        return (Reading(N.GPU_STATUS, ok, dev.tagged(N.HW_STATE, "ok")),
                Reading(N.GPU_STATUS, 1 - ok, dev.tagged(N.HW_STATE, "failed")))

    # ---- probing (once per device) ---------------------------------------------
    def _probe(self, dev: _Device) -> None:
        nvml = self._nvml
        mode = self._call(dev, "mig", "nvmlDeviceGetMigMode", dev.handle)
        enabled = mode is not _SKIP and mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        dev.mig_mode = "unsupported" if mode is _SKIP else ("enabled" if enabled else "disabled")
        if enabled:
            self._enumerate_migs(dev, self._clock())
        links = self._field_values(dev, "nvlink", [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
        dev.nvlink = bool(links and links[0])
        if not dev.nvlink:
            dev.unsupported.setdefault("nvlink", "no NVLink")
        try:
            reason = self._xid.register(dev.handle)
        except pynvml.NVMLError as err:
            raise _DeviceLost(E.describe_error(err)) from None
        if reason:
            dev.unsupported["xid"] = reason
        if not self._gpm_on:
            dev.gpm_status = "off (gpm=False)"
        elif enabled:
            dev.gpm_status = "not read in MIG mode"
        else:
            ok, dev.gpm_status = gpm_mod.query_support(nvml, dev.handle)
            if ok:
                try:
                    dev.gpm = gpm_mod.GpmDevice(nvml, dev.handle)
                except pynvml.NVMLError as err:
                    if E.classify(err) == E.LOST:
                        raise _DeviceLost(E.describe_error(err)) from None
                    dev.gpm_status = f"sample allocation failed ({E.describe_error(err)})"
        dev.probed = True

    def _enumerate_migs(self, dev: _Device, now: float) -> None:
        """List `dev`'s MIG devices; those listed before (same UUID) keep their state."""
        nvml = self._nvml
        known = {m.uuid: m for m in dev.migs}
        migs = []
        count = self._call(dev, "mig_devices", "nvmlDeviceGetMaxMigDeviceCount", dev.handle)
        for i in range(0 if count is _SKIP else count):
            try:
                h = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
                uuid = _text(nvml.nvmlDeviceGetUUID(h))
                mig = known.get(uuid)
                if mig is None:
                    mig = _Device(dev.index, h, uuid, _text(nvml.nvmlDeviceGetName(h)), dev)
                mig.handle = h
            except pynvml.NVMLError as err:
                if E.classify(err) == E.LOST:
                    raise _DeviceLost(E.describe_error(err)) from None
                continue  # NOT_FOUND: no MIG device in this slot
            migs.append(mig)
        dev.migs = migs
        dev.migs_listed_at = now

    # ---- reading one device ----------------------------------------------------
    def _read_device(self, dev: _Device, now: float, pids: set[int]) -> list[Reading]:
        nvml, a, out = self._nvml, dev.attrs, []
        add = out.append
        h = dev.handle
        task = dev.tagged(N.GPU_TASK, "general")
        u = self._call(dev, "utilization", "nvmlDeviceGetUtilizationRates", h)
        if u is not _SKIP:
            add(Reading(N.GPU_UTILIZATION, u.gpu / 100.0, task))
            add(Reading(N.GPU_MEMORY_UTILIZATION, u.memory / 100.0, task))
        out.extend(self._memory(dev))
        p = self._call(dev, "power", "nvmlDeviceGetPowerUsage", h)
        if p is not _SKIP:
            add(Reading(N.GPU_POWER, p / 1000.0, a))                     # mW -> W
        e = self._call(dev, "energy", "nvmlDeviceGetTotalEnergyConsumption", h)
        if e is not _SKIP:
            add(Reading(N.GPU_ENERGY, e / 1000.0, a))                    # mJ -> J
        t = self._call(dev, "temperature", "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
        if t is not _SKIP:
            add(Reading(N.GPU_TEMPERATURE, float(t), a))
        for domain, clock in (("sm", nvml.NVML_CLOCK_SM), ("memory", nvml.NVML_CLOCK_MEM)):
            c = self._call(dev, f"clock_{domain}", "nvmlDeviceGetClockInfo", h, clock)
            if c is not _SKIP:
                add(Reading(N.GPU_CLOCK, c * 1e6, dev.tagged(N.CLOCK_DOMAIN, domain)))  # MHz -> Hz
        mask = self._clock_events(dev)
        if mask is not _SKIP:
            out.extend(self._clock_event_readings(dev, int(mask)))
        out.extend(self._slow(dev, now))
        for code, n in sorted(dev.xid.items()):
            add(Reading(N.GPU_ERRORS, float(n), dev.tagged(N.ERROR_TYPE, f"xid_{code}")))
        out.extend(self._pcie(dev, now))
        out.extend(self._nvlink(dev))
        if dev.mig_mode == "enabled" and now - dev.migs_listed_at >= MIG_RESCAN_S:
            self._enumerate_migs(dev, now)   # an admin may have created or destroyed MIG devices
        if dev.migs:
            for mig in dev.migs:
                out.extend(self._memory(mig))
                out.extend(self._processes(mig, pids))
        else:
            out.extend(self._processes(dev, pids))
        if dev.gpm is not None:
            out.extend(self._gpm(dev, now))
        return out

    @staticmethod
    def _clock_event_readings(dev: _Device, mask: int) -> list[Reading]:
        """One reading per reason, built once per mask and device (masks rarely change)."""
        readings = dev.by_mask.get(mask)
        if readings is None:
            if len(dev.by_mask) > 64:
                dev.by_mask.clear()
            readings = dev.by_mask[mask] = [Reading(N.GPU_CLOCK_EVENT, active, dev.tagged(N.CLOCK_REASON, reason))
                                            for reason, active in _clock_reason_items(mask)]
        return readings

    def _clock_events(self, dev: _Device):
        """The clock-event reason mask; drivers older than the 'EventReasons' name get the 'Throttle' one."""
        mask = self._call(dev, "clock_events", dev.clock_fn, dev.handle)
        reason = dev.unsupported.get("clock_events", "")
        if mask is _SKIP and dev.clock_fn == _CLOCK_FNS[0] and reason.startswith(("Function Not Found", _CLOCK_FNS[0])):
            del dev.unsupported["clock_events"]
            dev.clock_fn = _CLOCK_FNS[1]
            mask = self._call(dev, "clock_events", dev.clock_fn, dev.handle)
        return mask

    def _memory(self, dev: _Device) -> list[Reading]:
        m = self._call(dev, "memory", "nvmlDeviceGetMemoryInfo", dev.handle)
        if m is _SKIP:
            return []
        return [Reading(N.GPU_MEMORY_USAGE, float(m.used), dev.attrs),
                Reading(N.GPU_MEMORY_LIMIT, float(m.total), dev.attrs)]

    def _slow(self, dev: _Device, now: float) -> list[Reading]:
        """Power limit and volatile ECC totals: they change by an admin's action or rarely, so
        they are read every SLOW_READ_S seconds and the same readings repeated in between."""
        if dev.slow is not None and now - dev.slow[0] < SLOW_READ_S:
            return dev.slow[1]
        nvml, out = self._nvml, []
        p = self._call(dev, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", dev.handle)
        if p is not _SKIP:
            out.append(Reading(N.GPU_POWER_LIMIT, p / 1000.0, dev.attrs))      # mW -> W
        for kind, etype in (("ecc_corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                            ("ecc_uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            n = self._call(dev, kind, "nvmlDeviceGetTotalEccErrors", dev.handle, etype, nvml.NVML_VOLATILE_ECC)
            if n is not _SKIP:
                out.append(Reading(N.GPU_ERRORS, float(n), dev.tagged(N.ERROR_TYPE, kind)))
        dev.slow = (now, out)
        return out

    def _pcie(self, dev: _Device, now: float) -> list[Reading]:
        """PCIe bytes, integrated (trapezoid) from NVML's KB/s samples (KB = 1024 bytes).

        NVML measures each sample over 20 ms inside the call, so it is taken at most every
        PCIE_MIN_INTERVAL_S seconds; a 100 ms agent would otherwise spend 320 ms a round on 8 GPUs.
        """
        nvml, out = self._nvml, []
        for direction, counter in (("transmit", nvml.NVML_PCIE_UTIL_TX_BYTES), ("receive", nvml.NVML_PCIE_UTIL_RX_BYTES)):
            state = dev.pcie.get(direction)
            if state is not None and now - state[2] < PCIE_MIN_INTERVAL_S:
                # each call samples a counter for 20 ms inside the driver: at most once a second
                out.append(Reading(N.GPU_PCIE_IO, state[0], dev.tagged(N.DIRECTION, direction)))
                continue
            rate = self._call(dev, f"pcie_{direction}", "nvmlDeviceGetPcieThroughput", dev.handle, counter)
            if rate is _SKIP:
                continue
            state = dev.pcie.get(direction)
            if state is None:
                state = dev.pcie[direction] = [0.0, float(rate), now]
            else:
                dt = max(now - state[2], 0.0)
                state[0] += (state[1] + rate) / 2.0 * KIB * dt
                state[1], state[2] = float(rate), now
            out.append(Reading(N.GPU_PCIE_IO, state[0], dev.tagged(N.DIRECTION, direction)))
        return out

    def _field_values(self, dev: _Device, field: str, ids: list) -> list[float] | None:
        """Values of NVML field ids (None when the call or any field is unsupported)."""
        vals = self._call(dev, field, "nvmlDeviceGetFieldValues", dev.handle, ids)
        if vals is _SKIP:
            return None
        out = []
        for v in vals:
            if v.nvmlReturn != pynvml.NVML_SUCCESS:
                dev.unsupported[field] = E.describe_error(pynvml.NVMLError(v.nvmlReturn))
                return None
            out.append(float(getattr(v.value, _VALUE_FIELD.get(v.valueType, "ullVal"))))
        return out

    def _nvlink(self, dev: _Device) -> list[Reading]:
        """NVLink data bytes, all links (NVML's cumulative KiB counters, scope 0 = GPU-wide)."""
        if not dev.nvlink:
            return []
        nvml = self._nvml
        vals = self._field_values(dev, "nvlink", [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
                                                  (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0)])
        if vals is None:
            return []
        return [Reading(N.GPU_NVLINK_IO, vals[0] * KIB, dev.tagged(N.DIRECTION, "transmit")),
                Reading(N.GPU_NVLINK_IO, vals[1] * KIB, dev.tagged(N.DIRECTION, "receive"))]

    def _processes(self, dev: _Device, pids: set[int]) -> list[Reading]:
        procs = self._call(dev, "processes", "nvmlDeviceGetComputeRunningProcesses", dev.handle)
        if procs is _SKIP:
            return []
        used: dict[int, float] = {}
        for p in procs:
            mem = getattr(p, "usedGpuMemory", None)
            used[int(p.pid)] = used.get(int(p.pid), 0.0) + float(mem or 0)
        out = []
        for pid, mem in sorted(used.items()):
            pids.add(pid)
            exe, rank = self._process_info(pid)
            attrs = {**dev.attrs, N.PID: str(pid), N.EXECUTABLE: exe}
            if rank is not None:
                attrs[N.RANK] = rank
            out.append(Reading(N.GPU_PROCESS_MEMORY, mem, attrs))
        return out

    def _process_info(self, pid: int) -> tuple[str, str | None]:
        """(executable name, rank) of `pid` from `proc_root`, cached while the PID stays."""
        info = self._proc_cache.get(pid)
        if info is None:
            try:
                with open(os.path.join(self._proc_root, str(pid), "comm"), encoding="utf-8", errors="replace") as f:
                    exe = f.read().strip()
            except OSError:
                exe = ""
            info = self._proc_cache[pid] = (exe, rank_of(pid, self._proc_root))
        return info

    def _gpm(self, dev: _Device, now: float) -> list[Reading]:
        try:
            values = dev.gpm.sample(now)
        except pynvml.NVMLError as err:
            kind = E.classify(err)
            if kind == E.LOST:
                raise _DeviceLost(E.describe_error(err)) from None
            if kind == E.UNSUPPORTED:
                dev.gpm_status = f"unsupported ({E.describe_error(err)})"
                dev.gpm.close()
                dev.gpm = None
            else:
                dev.errors["gpm"] = E.describe_error(err)
                self.partial_errors += 1
            return []
        return gpm_mod.gpm_readings(values, dev.attrs, nvlink=dev.nvlink, tagged=dev.tagged)

    # ---- doctor ------------------------------------------------------------------
    def describe(self) -> dict:
        """Driver, each GPU (name, UUID, index, MIG mode) and which metric groups it has."""
        if any(not d.probed and not d.failed for d in self.devices):
            self.read()
        gpus = []
        for d in self.devices:
            gpus.append({
                "index": d.index, "uuid": d.uuid, "name": d.name,
                "status": f"failed: {d.failed}" if d.failed else "ok",
                "mig_mode": d.mig_mode,
                "mig_devices": [{"uuid": m.uuid, "name": m.name, "profile": m.attrs.get(N.MIG_PROFILE)} for m in d.migs],
                "nvlink": d.nvlink,
                "gpm": d.gpm_status,
                "gpm_unsupported_metrics": sorted(d.gpm.unsupported) if d.gpm else [],
                "supported": [f for f in FIELDS if f not in d.unsupported] if d.probed else [],
                "unsupported": dict(sorted(d.unsupported.items())),
                "errors": dict(sorted(d.errors.items())),
                "xid_events": dict(sorted(d.xid.items())),
            })
        return {"source": self.name, "driver_version": self.driver, "gpu_count": len(self.devices),
                "partial_errors": self.partial_errors, "gpus": gpus}

    def close(self) -> None:
        """Free GPM samples and the event set, then `nvmlShutdown` (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for d in getattr(self, "devices", []):
            if d.gpm is not None:
                d.gpm.close()
                d.gpm = None
        try:
            if hasattr(self, "_xid"):
                self._xid.close()
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError:
            self.partial_errors += 1
