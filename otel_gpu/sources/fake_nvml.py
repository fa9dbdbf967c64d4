"""A fake NVML for tests, benchmarks and `--fake-gpus N`: GPUs described as data.

`FakeNvml` exposes the `pynvml` functions and constants that `NvmlSource` uses and
raises the real `pynvml.NVMLError` subclasses, so flaky hardware is data:

    FakeNvml(gpus=[FakeGpu(not_supported={"nvmlDeviceGetTotalEnergyConsumption"})] * 8)
    FakeNvml(gpus=[hopper(lost_after_reads=2)] + [hopper()] * 7)
    FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded)

Values are plausible and time-varying (taken from real H100/H200/A100 captures):
utilization moves around a load level, SM activity stays below it, energy and
NVLink counters grow with power and traffic over the fake's `clock`.

A device "read" (for `lost_after_reads`) is one pass over the device's functions:
the fake starts a new read of a device when a function is called on it again with
the same arguments. `calls[(function, index)]` counts every call per GPU index.

Calls cost what they cost on a real H100 (`H100_COSTS`, measured there: the energy counter
~4 ms of CPU, a PCIe throughput sample ~21 ms, 20 of them asleep), so the fake does not hide
what real NVML costs. `FakeNvml(costs={})` makes every call free; `costs={name: FakeCost(...)}`
scripts others. CPU cost is spent with the GIL released, as a C call into NVML does.
"""
from __future__ import annotations

import math
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pynvml

MIB = 1024 * 1024
_ARCH = {"volta": 5, "turing": 6, "ampere": 7, "ada": 8, "hopper": 9, "blackwell": 10}
_GPM_VALUES = ("NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_SM_OCCUPANCY", "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
               "NVML_GPM_METRIC_DRAM_BW_UTIL", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
               "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
               "NVML_GPM_METRIC_PCIE_RX_PER_SEC")


@dataclass(frozen=True)
class FakeCost:
    """What one call costs: `cpu_s` seconds of CPU (busy, GIL released) and `sleep_s` seconds asleep, and
    `first_sleep_s` seconds more asleep in the function's first call on each GPU (a one-time set-up)."""

    cpu_s: float = 0.0
    sleep_s: float = 0.0
    first_sleep_s: float = 0.0


# Per-call cost on an H100 80GB HBM3, driver 580.159.04 (wall / CPU of 100 calls each): the energy
# counter 4.07 / 4.02 ms (nvmlDeviceGetFieldValues with the energy field the same), a PCIe throughput
# sample 20.9 / 0.79 ms, a GPM sample 0.04 ms, memory info and running processes ~0.007 ms; the rest
# (utilization, power, temperature, clocks, clock-event reasons) ~0.001 ms, below the fake's own cost.
H100_COSTS: dict[str, FakeCost] = {
    "nvmlDeviceGetTotalEnergyConsumption": FakeCost(cpu_s=4.02e-3, sleep_s=0.05e-3),
    "nvmlDeviceGetPcieThroughput": FakeCost(cpu_s=0.79e-3, sleep_s=20.1e-3),
    "nvmlGpmSampleGet": FakeCost(cpu_s=0.04e-3),
    "nvmlDeviceGetMemoryInfo": FakeCost(cpu_s=0.007e-3),
    "nvmlDeviceGetComputeRunningProcesses": FakeCost(cpu_s=0.007e-3),
}
_GRID_S = 0.1   # s: the fake integrates power and traffic on this grid
_BLOCK = bytes(64 * 1024)   # zlib.crc32 releases the GIL on buffers over 5 KiB


def spend(cost: FakeCost) -> None:
    """Sleep `cost.sleep_s`, then burn `cost.cpu_s` of this thread's CPU with the GIL released."""
    if cost.sleep_s > 0:
        time.sleep(cost.sleep_s)
    if cost.cpu_s > 0:
        end = time.thread_time() + cost.cpu_s
        while time.thread_time() < end:
            if cost.cpu_s > 50e-6:
                zlib.crc32(_BLOCK)


@dataclass(frozen=True)
class FakeMig:
    """One MIG device: profile (e.g. '1g.10gb'), memory size and use in bytes."""

    profile: str
    memory_total: int
    memory_used: int = 9 * MIB


@dataclass(frozen=True)
class FakeProcess:
    pid: int
    used_memory: int  # bytes


@dataclass(frozen=True)
class FakeGpu:
    """A GPU as data. Defaults: an H100 SXM under training load (590.48.01 capture)."""

    name: str = "NVIDIA H100 80GB HBM3"
    arch: str = "hopper"
    memory_total: int = 81559 * MIB
    power_limit_w: float = 700.0
    idle_power_w: float = 69.0
    load_power_w: float = 632.0
    sm_clock_mhz: tuple[int, int] = (345, 1980)   # idle, busy
    mem_clock_mhz: int = 2619
    temperature_c: tuple[int, int] = (41, 64)     # idle, busy
    load: float = 0.9                             # mean utilization, 0..1
    sm_share: float = 0.62                        # GPM SM activity per unit of utilization
    stall: tuple[float, float] | None = None      # (period s, stall s): idle for the last stall s of each period
    nvlinks: int = 18
    pcie_kbps: tuple[float, float] | None = None  # fixed (tx, rx) KB/s, else varying
    clock_event_reasons: int | None = None        # fixed bit mask, else from load and power
    ecc_errors: tuple[int, int] = (0, 0)          # volatile corrected, uncorrected
    xids: tuple[int, ...] = ()                    # XID codes pending at start
    remapped_rows: tuple[int, int, bool, bool] = (0, 0, False, False)   # corrected, uncorrected, pending, failed
    retired_pages: tuple[int, int] = (0, 0)       # single-bit, double-bit (pre-Ampere only: NOT_SUPPORTED after)
    nvlink_errors: tuple[tuple[int, int, int, int], ...] = ()   # per link: replay, recovery, CRC flit, CRC data
    pcie_replays: int = 0
    pcie_link: tuple[int, int, int, int] = (5, 16, 5, 16)   # current generation, width; maximum generation, width
    max_clocks_mhz: tuple[int, int] | None = None   # (SM, memory) maximum; default: the busy SM clock, the memory clock
    processes: tuple[FakeProcess, ...] = ()
    mig_devices: tuple[FakeMig, ...] = ()
    not_supported: frozenset[str] = frozenset()   # NVML function names answering NOT_SUPPORTED
    missing_functions: frozenset[str] = frozenset()  # ... answering FUNCTION_NOT_FOUND (older driver)
    lost_after_reads: int | None = None           # reads that work before GPU_IS_LOST
    uuid: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "not_supported", frozenset(self.not_supported))
        object.__setattr__(self, "missing_functions", frozenset(self.missing_functions))


def hopper(**kw) -> FakeGpu:
    """An H100 80GB HBM3 (SXM, 18 NVLinks)."""
    return FakeGpu(**kw)


def h200(**kw) -> FakeGpu:
    """An H200 (141 GB HBM3e, 3201 MHz memory clock)."""
    return FakeGpu(**{"name": "NVIDIA H200", "memory_total": 143771 * MIB, "idle_power_w": 77.0,
                      "load_power_w": 630.0, "mem_clock_mhz": 3201, "temperature_c": (28, 54), **kw})


def a100(**kw) -> FakeGpu:
    """An A100-SXM4-80GB (Ampere: no GPM, 12 NVLinks, 500 W)."""
    return FakeGpu(**{"name": "NVIDIA A100-SXM4-80GB", "arch": "ampere", "memory_total": 81920 * MIB,
                      "power_limit_w": 500.0, "idle_power_w": 60.0, "load_power_w": 410.0,
                      "sm_clock_mhz": (210, 1410), "mem_clock_mhz": 1593, "nvlinks": 12, "pcie_link": (4, 16, 4, 16),
                      **kw})


H100_MIG = (FakeMig("3g.40gb", 40448 * MIB, 11091 * MIB), FakeMig("2g.20gb", 20096 * MIB, 17 * MIB),
            FakeMig("1g.10gb", 9984 * MIB), FakeMig("1g.10gb", 9984 * MIB))


class _Handle:
    """A fake device handle (one GPU or one MIG device)."""

    def __init__(self, spec: FakeGpu, index: int, uuid: str, name: str, parent=None, mig=None):
        self.spec, self.index, self.uuid, self.name, self.parent, self.mig = spec, index, uuid, name, parent, mig
        self.reads = 0
        self.seen: set = set()
        self.lost = False
        self.energy_mj = self.cell_energy_mj = 1.0e9 + index * 1.0e7   # since "driver load"
        self.nvlink_kib = [0.0, 0.0]
        self.cell_nvlink_kib = 0.0
        self.cells = 0   # whole _GRID_S cells integrated
        self.util_t, self.util = float("-inf"), 0.0
        self.xids = list(spec.xids)
        self.destroyed = False   # a MIG device removed by set_mig_devices

    def __repr__(self):
        return f"<fake nvmlDevice {self.uuid}>"


def _key(a):
    if isinstance(a, (int, str, float)):
        return a
    if isinstance(a, (list, tuple)):
        return tuple(_key(x) for x in a)
    return type(a).__name__


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class _GpmMetricsGet:
    """Stand-in for `c_nvmlGpmMetricsGet_t` (plain attributes instead of ctypes)."""

    def __init__(self):
        self.version = 0
        self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(pynvml.NVML_GPM_METRIC_MAX)]


class _FieldUnion:
    """Stand-in for `c_nvmlValue_t`: the value as a float (`dVal`) and each integer member as its
    integer part, computed when asked (a field value is read through one member)."""

    __slots__ = ("dVal", "_raw")
    _INTS = frozenset(("uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal"))

    def __init__(self, value):
        self._raw = value
        self.dVal = float(value)

    def __getattr__(self, name):
        if name in _FieldUnion._INTS:
            return int(self._raw)
        raise AttributeError(name)


class _FieldValue:
    """Stand-in for `c_nvmlFieldValue_t` (plain attributes instead of ctypes)."""

    __slots__ = ("fieldId", "scopeId", "nvmlReturn", "valueType", "value", "timestamp")

    def __init__(self, fid: int, scope: int, ret: int, value):
        self.fieldId, self.scopeId, self.nvmlReturn = fid, scope, ret
        self.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        self.value = _FieldUnion(value)
        self.timestamp = 0


class FakeNvml:
    """Module-like fake of `pynvml` built from `FakeGpu` descriptions."""

    c_nvmlGpmMetricsGet_t = _GpmMetricsGet
    NVMLError = pynvml.NVMLError

    def __init__(self, gpus=(), driver: str = "590.48.01", init_error=None, clock=time.monotonic,
                 costs: dict[str, FakeCost] | None = None):
        self.gpus = list(gpus)
        self.costs = dict(H100_COSTS if costs is None else costs)
        self._lock = threading.Lock()   # NVML is thread-safe: so is the fake's bookkeeping
        self.driver = driver
        self.init_error = init_error
        self.clock = clock
        self.calls: Counter = Counter()
        self.initialized = 0
        self._t0 = clock()
        self._handles = []
        for i, spec in enumerate(self.gpus):
            uuid = spec.uuid or f"GPU-{i:08x}-fa4e-4e00-8000-{0x5eed0000 + i:012x}"
            h = _Handle(spec, i, uuid, spec.name)
            h.migs = [self._mig_handle(h, k, m) for k, m in enumerate(spec.mig_devices)]
            self._handles.append(h)
        self._event_sets: list[list] = []
        self._mig_serial = 0
        self._adopted = None   # GPU index -> PIDs of real processes listed on it (fake_ranks.py)

    def _mig_handle(self, gpu: _Handle, k: int, mig: FakeMig, serial: int = 0) -> _Handle:
        i = gpu.index
        uuid = f"MIG-{i:04x}{k:04x}-fa4e-4e00-{0x8000 + serial:04x}-{0x5eed0000 + i:012x}"
        return _Handle(gpu.spec, i, uuid, f"{gpu.spec.name} MIG {mig.profile}", parent=gpu, mig=mig)

    def set_mig_devices(self, index: int, keep: int, new: tuple[FakeMig, ...]) -> None:
        """What an admin's `nvidia-smi mig` does while the agent runs: GPU `index` keeps its
        first `keep` MIG devices, the others are destroyed (their handles answer
        INVALID_ARGUMENT from now on) and `new` ones are created with new UUIDs."""
        gpu = self._handles[index]
        kept, gone = gpu.migs[:keep], gpu.migs[keep:]
        for h in gone:
            h.destroyed = True
        self._mig_serial += 1
        created = [self._mig_handle(gpu, keep + k, m, self._mig_serial) for k, m in enumerate(new)]
        gpu.spec = replace(gpu.spec, mig_devices=tuple(h.mig for h in kept) + tuple(new))
        for h in kept + created:
            h.spec = gpu.spec
        gpu.migs = kept + created

    def adopt(self, on_gpu) -> None:
        """List real processes too: `on_gpu(index)` gives the PIDs on GPU `index` (each said to use 1 GiB)."""
        self._adopted = on_gpu

    def set_processes(self, index: int, processes: tuple[FakeProcess, ...]) -> None:
        """What jobs starting and ending do: GPU `index` lists `processes` from now on."""
        gpu = self._handles[index]
        gpu.spec = replace(gpu.spec, processes=tuple(processes))
        for h in gpu.migs:
            h.spec = gpu.spec

    def __getattr__(self, name):
        if name.startswith(("NVML_", "NVMLError", "nvmlClocks", "nvmlEventType")):
            value = getattr(pynvml, name)
            setattr(self, name, value)   # found in the instance next time
            return value
        raise AttributeError(f"FakeNvml has no {name}")

    # ---- bookkeeping ---------------------------------------------------------------
    def _enter(self, fn: str, h: _Handle, *args) -> _Handle:
        """Count the call, advance the device's read, raise the errors its spec asks for."""
        if not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        root = h.parent or h
        with self._lock:
            self.calls[(fn, h.index)] += 1
            first = self.calls[(fn, h.index)] == 1
            lost_after = root.spec.lost_after_reads
            if lost_after is not None:   # a read ends when a call repeats with the same arguments
                key = (fn, _key(args))
                if key in h.seen:
                    h.reads += 1
                    h.seen = set()
                h.seen.add(key)
                if root.reads >= lost_after and not root.lost:
                    root.lost = True
                    root.xids.append(79)   # "GPU has fallen off the bus"
        cost = self.costs.get(fn)
        if cost is not None:
            spend(cost)
            if first and cost.first_sleep_s > 0:
                time.sleep(cost.first_sleep_s)
        if root.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if h.destroyed:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if fn in h.spec.missing_functions:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if fn in h.spec.not_supported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h

    def _t(self) -> float:
        return self.clock() - self._t0

    def _util(self, h: _Handle) -> float:
        """Utilization 0..1 now (one value per millisecond: the calls of one read agree)."""
        t = self._t()
        if t - h.util_t >= 1e-3:
            h.util_t, h.util = t, self._util_at(h, t)
        return h.util

    @staticmethod
    def _util_at(h: _Handle, t: float) -> float:
        """Utilization 0..1 at fake time `t` (s) around the spec's load, varying with time, per GPU phase."""
        load, stall = h.spec.load, h.spec.stall
        if stall is not None and t % stall[0] >= stall[0] - stall[1]:
            return 0.02   # stalled: waiting on something else, SMs idle
        wave = 0.08 * math.sin(2 * math.pi * t / 7.0 + h.index) + 0.04 * math.sin(2 * math.pi * t / 1.3 + 2 * h.index)
        return min(1.0, max(0.0, load + wave * (1 if load > 0.05 else 0)))

    def _power_w(self, h: _Handle) -> float:
        s = h.spec
        return s.idle_power_w + (s.load_power_w - s.idle_power_w) * self._util(h)

    def _rates_at(self, h: _Handle, t: float) -> tuple[float, float]:
        """(power W, NVLink KiB/s per direction) at fake time `t`."""
        s, u = h.spec, self._util_at(h, t)
        nvl = 40e6 * u if s.nvlinks and not s.mig_devices else 0.0   # ~40 GiB/s per direction at full load
        return s.idle_power_w + (s.load_power_w - s.idle_power_w) * u, nvl

    def _advance(self, h: _Handle) -> None:
        """Energy and NVLink counters at now: power and traffic integrated (midpoint rule) on a fixed
        `_GRID_S` grid from fake time 0, so they are functions of time alone, whoever reads them when."""
        with self._lock:
            now = max(self._t(), 0.0)
            cells = h.cells
            if (cells + 1) * _GRID_S <= now:   # _rates_at, inlined: ~10 cells a second per GPU
                s, util_at = h.spec, self._util_at
                idle, span, nvl_on = s.idle_power_w, s.load_power_w - s.idle_power_w, s.nvlinks and not s.mig_devices
                energy, kib = h.cell_energy_mj, h.cell_nvlink_kib
                while (cells + 1) * _GRID_S <= now:
                    u = util_at(h, (cells + 0.5) * _GRID_S)
                    energy += (idle + span * u) * 1000.0 * _GRID_S
                    kib += (40e6 * u if nvl_on else 0.0) * _GRID_S
                    cells += 1
                h.cell_energy_mj, h.cell_nvlink_kib, h.cells = energy, kib, cells
            part = now - h.cells * _GRID_S
            p, nvl = self._rates_at(h, h.cells * _GRID_S + part / 2)
            h.energy_mj = h.cell_energy_mj + p * 1000.0 * part
            tx = h.cell_nvlink_kib + nvl * part
            h.nvlink_kib = [tx, tx * 1.02]

    # ---- init / system ---------------------------------------------------------------
    def nvmlInit(self):
        self.calls[("nvmlInit", None)] += 1
        if self.init_error is not None:
            err = self.init_error
            raise err() if isinstance(err, type) else err
        self.initialized += 1

    def nvmlShutdown(self):
        self.calls[("nvmlShutdown", None)] += 1
        if not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self):
        if not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.driver

    def nvmlDeviceGetCount(self):
        if not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self._handles)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self._handles):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._enter("nvmlDeviceGetHandleByIndex", self._handles[index], index)

    # ---- identity ----------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, h):
        return self._enter("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h):
        return self._enter("nvmlDeviceGetName", h).name

    def nvmlDeviceGetArchitecture(self, h):
        return _ARCH.get(self._enter("nvmlDeviceGetArchitecture", h).spec.arch, pynvml.NVML_DEVICE_ARCH_UNKNOWN)

    def nvmlDeviceGetMigMode(self, h):
        self._enter("nvmlDeviceGetMigMode", h)
        if _ARCH.get(h.spec.arch, 0) < _ARCH["ampere"]:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if h.spec.mig_devices else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7 if h.spec.mig_devices else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, index):
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h, index)
        if index >= len(h.migs):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return h.migs[index]

    def nvmlDeviceIsMigDeviceHandle(self, h):
        return int(self._enter("nvmlDeviceIsMigDeviceHandle", h).mig is not None)

    # ---- readings ----------------------------------------------------------------------
    def _whole_gpu(self, fn: str, h: _Handle, *args) -> _Handle:
        """Calls that a MIG-mode GPU (or a MIG device) answers NOT_SUPPORTED."""
        self._enter(fn, h, *args)
        if h.mig is not None or h.spec.mig_devices:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h

    def nvmlDeviceGetUtilizationRates(self, h):
        u = self._util(self._whole_gpu("nvmlDeviceGetUtilizationRates", h))
        return SimpleNamespace(gpu=int(round(u * 100)), memory=int(round(u * 12)))

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        self._enter("nvmlDeviceGetMemoryInfo", h)
        if h.mig is not None:
            total, used = h.mig.memory_total, h.mig.memory_used
        elif h.spec.mig_devices:
            total = h.spec.memory_total
            used = sum(m.memory_used for m in h.spec.mig_devices) + 8 * MIB
        else:
            total = h.spec.memory_total
            used = int(total * (0.02 + 0.75 * min(1.0, h.spec.load)) + sum(p.used_memory for p in h.spec.processes))
            used = min(used, total)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPowerUsage(self, h):
        return int(self._power_w(self._enter("nvmlDeviceGetPowerUsage", h)) * 1000)   # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return int(self._enter("nvmlDeviceGetEnforcedPowerLimit", h).spec.power_limit_w * 1000)  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self._advance(self._enter("nvmlDeviceGetTotalEnergyConsumption", h))
        return int(h.energy_mj)   # mJ

    def nvmlDeviceGetTemperature(self, h, sensor):
        s = self._enter("nvmlDeviceGetTemperature", h, sensor).spec
        return int(round(s.temperature_c[0] + (s.temperature_c[1] - s.temperature_c[0]) * self._util(h)))

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        s = self._enter("nvmlDeviceGetClockInfo", h, clock_type).spec
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return s.mem_clock_mhz
        return s.sm_clock_mhz[1] if self._util(h) > 0.05 else s.sm_clock_mhz[0]

    def nvmlDeviceGetMaxClockInfo(self, h, clock_type):
        s = self._gpu_only("nvmlDeviceGetMaxClockInfo", h, clock_type).spec
        sm, mem = s.max_clocks_mhz or (s.sm_clock_mhz[1], s.mem_clock_mhz)
        return mem if clock_type == pynvml.NVML_CLOCK_MEM else sm

    def nvmlDeviceGetCurrentClocksEventReasons(self, h, _fn="nvmlDeviceGetCurrentClocksEventReasons"):
        s = self._enter(_fn, h).spec
        if s.clock_event_reasons is not None:
            return s.clock_event_reasons
        if self._util(h) <= 0.05:
            return pynvml.nvmlClocksEventReasonGpuIdle
        return pynvml.nvmlClocksEventReasonSwPowerCap if self._power_w(h) > 0.97 * s.power_limit_w else 0

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self.nvmlDeviceGetCurrentClocksEventReasons(h, "nvmlDeviceGetCurrentClocksThrottleReasons")

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        s = self._enter("nvmlDeviceGetTotalEccErrors", h, error_type, counter_type).spec
        return s.ecc_errors[0 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1]

    # ---- health ----------------------------------------------------------------------------
    def _gpu_only(self, fn: str, h: _Handle, *args) -> _Handle:
        """Calls a MIG device answers NOT_SUPPORTED (its GPU answers them)."""
        self._enter(fn, h, *args)
        if h.mig is not None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h

    def nvmlDeviceGetRemappedRows(self, h):
        s = self._gpu_only("nvmlDeviceGetRemappedRows", h).spec
        if _ARCH.get(s.arch, 0) < _ARCH["ampere"]:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        corrected, uncorrected, pending, failed = s.remapped_rows
        return (corrected, uncorrected, int(pending), int(failed))

    def nvmlDeviceGetRetiredPages(self, h, cause):
        s = self._gpu_only("nvmlDeviceGetRetiredPages", h, cause).spec
        if _ARCH.get(s.arch, 0) >= _ARCH["ampere"]:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)   # row remapping replaced page retirement
        n = s.retired_pages[0 if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS else 1]
        return [0x1000 * (k + 1) for k in range(n)]

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        s = self._gpu_only("nvmlDeviceGetNvLinkErrorCounter", h, link, counter).spec
        if not 0 <= link < s.nvlinks:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return s.nvlink_errors[link][counter] if link < len(s.nvlink_errors) else 0

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._gpu_only("nvmlDeviceGetPcieReplayCounter", h).spec.pcie_replays

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h).spec.pcie_link[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._enter("nvmlDeviceGetCurrPcieLinkWidth", h).spec.pcie_link[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._enter("nvmlDeviceGetMaxPcieLinkGeneration", h).spec.pcie_link[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._enter("nvmlDeviceGetMaxPcieLinkWidth", h).spec.pcie_link[3]

    def set_health(self, index: int, **fields) -> None:
        """What a failing GPU does while the agent runs: GPU `index`'s health fields (`remapped_rows`,
        `nvlink_errors`, `pcie_replays`, `pcie_link`, ...) take these values from now on."""
        gpu = self._handles[index]
        gpu.spec = replace(gpu.spec, **fields)

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._enter("nvmlDeviceGetPcieThroughput", h, counter)
        if h.mig is not None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self._pcie_kib_s(h, counter == pynvml.NVML_PCIE_UTIL_TX_BYTES))   # KB/s

    def _pcie_kib_s(self, h: _Handle, tx: bool) -> float:
        """PCIe traffic, KiB/s: the throughput call reports it, GPM reports it / 1024 as MiB/s."""
        s = h.spec
        if s.pcie_kbps is not None:
            return float(s.pcie_kbps[0 if tx else 1])
        return (9000 if tx else 19000) + 250000 * self._util(h) * (0.6 if tx else 1.0)

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        self._enter("nvmlDeviceGetFieldValues", h, field_ids)
        energy_id = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
        ids = [(f, 0) if not isinstance(f, tuple) else f for f in field_ids]
        if any(fid == energy_id for fid, _ in ids):
            cost = self.costs.get("nvmlDeviceGetTotalEnergyConsumption")   # measured: the same cost
            if cost is not None:
                spend(cost)
        self._advance(h)
        out = []
        unsupported = bool(h.spec.mig_devices or h.mig is not None)
        for fid, scope in ids:
            ret, value = pynvml.NVML_SUCCESS, 0.0
            if unsupported:
                ret = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif fid == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                value = h.spec.nvlinks
            elif fid == energy_id:
                value = h.energy_mj
            elif fid in _NVLINK_DATA:
                if not h.spec.nvlinks:
                    ret = pynvml.NVML_ERROR_NOT_SUPPORTED
                value = h.nvlink_kib[_NVLINK_DATA[fid]]
            else:
                ret = pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append(_FieldValue(fid, scope, ret, value))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._enter("nvmlDeviceGetComputeRunningProcesses", h)
        if h.spec.mig_devices and h.mig is None:
            return []
        procs = h.spec.processes if h.mig is None else (h.spec.processes if h is h.parent.migs[0] else ())
        if self._adopted is not None and h.mig is None:
            procs = tuple(procs) + tuple(FakeProcess(pid, 1 << 30) for pid in self._adopted(h.index))
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory, gpuInstanceId=0xFFFFFFFF,
                                computeInstanceId=0xFFFFFFFF) for p in procs]

    # ---- events (XID) ----------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        if not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        s: list = []
        self._event_sets.append(s)
        return s

    def nvmlDeviceGetSupportedEventTypes(self, h):
        self._enter("nvmlDeviceGetSupportedEventTypes", h)
        return (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError
                | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypeClock)

    def nvmlDeviceRegisterEvents(self, h, event_types, event_set):
        self._enter("nvmlDeviceRegisterEvents", h, event_types)
        event_set.append(h)

    def nvmlEventSetWait(self, event_set, timeout_ms):
        for h in event_set:
            if h.xids:
                code = h.xids.pop(0)
                return SimpleNamespace(device=h, eventType=pynvml.nvmlEventTypeXidCriticalError,
                                       eventData=code, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
        raise _err(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set):
        event_set.clear()

    def inject_xid(self, index: int, code: int) -> None:
        """Queue an XID critical error event on GPU `index`."""
        self._handles[index].xids.append(code)

    # ---- GPM -----------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h):
        self._enter("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(_ARCH.get(h.spec.arch, 0) >= _ARCH["hopper"]))

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace(t=None, device=None)

    def nvmlGpmSampleFree(self, sample):
        sample.t = None

    def nvmlGpmSampleGet(self, h, sample):
        self._enter("nvmlGpmSampleGet", h)
        if _ARCH.get(h.spec.arch, 0) < _ARCH["hopper"]:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        sample.t, sample.device = self._t(), h
        return sample

    def nvmlGpmMetricsGet(self, req):
        s1, s2 = req.sample1, req.sample2
        if s1 is None or s2 is None or s1.t is None or s2.t is None or s1.device is not s2.device:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        h = s2.device
        self._enter("nvmlGpmMetricsGet", h)
        u = self._util(h)
        sm = 100 * u * h.spec.sm_share
        nvl = (40e3 * u) if h.spec.nvlinks else 0.0      # MiB/s
        by_id = dict(zip(_GPM_ID_ORDER, (sm, sm * 0.45, sm * 0.6, 100 * u * 0.4, nvl, nvl * 1.02,
                                          self._pcie_kib_s(h, True) / 1024, self._pcie_kib_s(h, False) / 1024)))
        success, unsupported = pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED
        metrics = req.metrics
        for k in range(req.numMetrics):
            m = metrics[k]
            value = by_id.get(m.metricId)
            if value is not None:
                m.nvmlReturn, m.value = success, value
            else:
                m.nvmlReturn, m.value = unsupported, 0.0
        return req


_GPM_IDS = {n: getattr(pynvml, n) for n in (
    "NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_SM_OCCUPANCY", "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "NVML_GPM_METRIC_DRAM_BW_UTIL", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC", "NVML_GPM_METRIC_PCIE_RX_PER_SEC")}
_GPM_ID_ORDER = tuple(_GPM_IDS.values())   # the order of the values nvmlGpmMetricsGet computes
_NVLINK_DATA = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 0, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 1}


def fake_cluster_node(n: int = 8, arch: str = "hopper", **kw) -> FakeNvml:
    """A node of `n` identical GPUs: 'hopper' (H100), 'h200' or 'ampere' (A100); `kw` go to FakeNvml."""
    make = {"hopper": hopper, "h200": h200, "ampere": a100}.get(arch)
    if make is None:
        raise ValueError(f"unknown fake GPU architecture {arch!r} (hopper, h200, ampere)")
    return FakeNvml(gpus=[make()] * n, **kw)


__all__ = ["H100_COSTS", "FakeCost", "FakeGpu", "FakeMig", "FakeNvml", "FakeProcess", "H100_MIG", "a100", "fake_cluster_node", "h200", "hopper"]
