"""The costly NVML fields (energy, PCIe bytes) and the per-field cost table of `otel-gpu doctor`.

Energy is read apart from the sampling round, at a period nvml_cadence.py sets from its measured
cost; PCIe bytes come from GPM's PCIe rates where GPM gives them, else from PCIe throughput
samples read apart from the round. Reads run in a `BackgroundLane` when there is one, else
within the round when due. `CostlyFields` is used by `NvmlSource` (nvml.py), which owns the
devices and passes in its `call` (nvml_device.call with its error counter).
"""
from __future__ import annotations

import time
from functools import partial
from typing import Callable

import pynvml

from .. import names as N
from ..readings import SLOW_READ_S, Reading, new_reading
from . import gpm as gpm_mod
from . import nvml_errors as E
from .nvml_cadence import BUDGET_CPU, BackgroundLane, SlowField, median, stretch, timed
from .nvml_device import KIB, MIB, MIG_RESCAN_S, SKIP, Device, DeviceLost

PCIE_MIN_INTERVAL_S = 1.0   # seconds between nvmlDeviceGetPcieThroughput calls per device, at least
ENERGY_MIN_INTERVAL_S = 10.0   # seconds between energy counter reads per device, at least (when costly)
STEADY_CALLS = 3   # calls after the first that doctor's per-call cost is the median of
GPM_PCIE = {"transmit": "NVML_GPM_METRIC_PCIE_TX_PER_SEC", "receive": "NVML_GPM_METRIC_PCIE_RX_PER_SEC"}
FIELDS = ("utilization", "memory", "power", "power_limit", "energy", "temperature", "clock_sm", "clock_memory",
          "clock_events", "ecc_corrected", "ecc_uncorrected", "pcie_transmit", "pcie_receive", "nvlink",
          "processes", "xid", "mig", "row_remap", "retired_pages", "nvlink_errors", "pcie_replay",
          "pcie_link", "clock_max")  # metric groups, as describe() names them
CALLS = {"utilization": "GetUtilizationRates", "memory": "GetMemoryInfo", "power": "GetPowerUsage",
         "power_limit": "GetEnforcedPowerLimit", "energy": "GetTotalEnergyConsumption", "temperature": "GetTemperature",
         "clock_sm": "GetClockInfo", "clock_memory": "GetClockInfo", "clock_events": "GetCurrentClocksEventReasons",
         "ecc_corrected": "GetTotalEccErrors", "ecc_uncorrected": "GetTotalEccErrors",
         "pcie_transmit": "GetPcieThroughput", "pcie_receive": "GetPcieThroughput", "nvlink": "GetFieldValues",
         "processes": "GetComputeRunningProcesses", "xid": "nvmlEventSetWait", "mig": "GetMigMode",
         "gpm": "nvmlGpmSampleGet", "row_remap": "GetRemappedRows", "retired_pages": "GetRetiredPages",
         "nvlink_errors": "GetNvLinkErrorCounter", "pcie_replay": "GetPcieReplayCounter",
         "pcie_link": "GetCurrPcieLinkGeneration", "clock_max": "GetMaxClockInfo"}   # field -> NVML call (nvmlDevice prefix left out)
_GPM_PCIE_NAMES = frozenset(GPM_PCIE.values())


def _ms(seconds: float) -> float:
    """Seconds as milliseconds to 3 significant digits."""
    return float(f"{seconds * 1e3:.3g}")


class CostlyFields:
    """Energy and PCIe bytes of `devices`, read at the cadence their measured costs allow.

    `call(dev, field, fn_name, *args)` makes one NVML call (SKIP when not read, DeviceLost when
    the GPU is gone); `clock` is the source's (s, monotonic). `cadence=False` reads energy in
    every round and PCIe throughput every PCIE_MIN_INTERVAL_S (the reference); with `background`
    the costly reads run on a thread of their own; all of them together use at most `budget_cpu`
    of one core.
    """

    def __init__(self, nvml, devices: list[Device], call: Callable, clock: Callable[[], float],
                 cadence: bool = True, background: bool = False, budget_cpu: float = BUDGET_CPU,
                 interval_s: float | None = None):
        self._nvml, self._devices, self._call, self._clock = nvml, devices, call, clock
        self.interval_s = interval_s   # how often the source is read (s), for doctor's "read" column
        self.cadence, self._budget_cpu = cadence, budget_cpu
        self.lane = BackgroundLane() if cadence and background else None

    @property
    def errors(self) -> int:
        """Background reads that failed as a whole (a bug, logged)."""
        return self.lane.errors if self.lane is not None else 0

    def setup(self, dev: Device) -> None:
        """At the end of `dev`'s probe: its costly fields, each with its floor period."""
        if self.cadence:
            dev.costly["energy"] = SlowField("energy", ENERGY_MIN_INTERVAL_S)
        dev.costly["pcie"] = SlowField("pcie", PCIE_MIN_INTERVAL_S)   # read where GPM gives no PCIe rates

    def pending(self) -> bool:
        """A background read is under way."""
        return any(f.pending for d in self._devices for f in list(d.costly.values()))

    def close(self) -> None:
        if self.lane is not None:
            self.lane.close()

    # ---- one costly field --------------------------------------------------------------
    def _costly(self, dev: Device, slow: SlowField, now: float, read) -> list[Reading]:
        """`slow`'s last readings; a new read of it (`read(dev)`) starts when due: in the
        background lane, or here when there is none."""
        if slow.due(now):
            slow.submitted_at = now
            if self.lane is None:
                self._read_costly(slow, read, dev)
            else:
                slow.pending = True
                self.lane.submit(partial(self._read_in_background, dev, slow, read))
        return slow.readings

    def _read_in_background(self, dev: Device, slow: SlowField, read) -> None:
        try:
            if not dev.failed:
                self._read_costly(slow, read, dev)
        except DeviceLost as lost:
            dev.lost_pending = str(lost)   # the sampling round marks it lost (it owns the GPM samples)
        finally:
            slow.pending = False

    def _read_costly(self, slow: SlowField, read, dev: Device) -> None:
        c0 = time.thread_time()
        slow.readings = read(dev)
        slow.cpu_s = time.thread_time() - c0
        if self.cadence:
            self._plan()

    def _plan(self) -> None:
        """Stretch every costly field's period alike so that together they stay within budget;
        a candidate that proved cheap here is read in the round from now on."""
        load = 0.0
        for dev in self._devices:
            for name, slow in list(dev.costly.items()):
                cost = dev.costs.get(name)
                if name == "energy" and cost is not None and cost.known and not cost.costly:
                    del dev.costly[name]
                    continue
                if slow.read_at is not None or slow.cpu_s:
                    load += slow.cpu_s / slow.floor_s
        factor = stretch(load, self._budget_cpu)
        for dev in self._devices:
            for slow in list(dev.costly.values()):
                slow.period_s = slow.floor_s * factor

    # ---- energy ------------------------------------------------------------------------
    def energy(self, dev: Device, now: float) -> list[Reading]:
        """Total energy (J) since the driver loaded: exact whenever read, repeated in between."""
        if "energy" in dev.unsupported:
            return []
        slow = dev.costly.get("energy")
        if slow is not None:
            return self._costly(dev, slow, now, self._read_energy)
        return self._read_energy(dev)

    def _read_energy(self, dev: Device) -> list[Reading]:
        t = self._clock()
        e = self._call(dev, "energy", "nvmlDeviceGetTotalEnergyConsumption", dev.handle)
        slow = dev.costly.get("energy")
        if slow is not None:
            slow.read_at = t
        return [] if e is SKIP else [Reading(N.GPU_ENERGY, e / 1000.0, dev.attrs)]   # mJ -> J

    # ---- PCIe bytes --------------------------------------------------------------------
    def pcie_from_gpm(self, dev: Device) -> bool:
        return self.cadence and dev.gpm is not None and not (_GPM_PCIE_NAMES & dev.gpm.unsupported)

    def add_gpm_rates(self, dev: Device, values: dict[str, float]) -> None:
        """After a GPM sample: a new computation's PCIe rates (MiB/s) x its interval grow the byte counters."""
        if dev.gpm.computed != dev.gpm_seen and self.pcie_from_gpm(dev):
            dev.gpm_seen = dev.gpm.computed
            for direction, metric in GPM_PCIE.items():
                rate = values.get(metric)
                if rate is not None:
                    dev.pcie_bytes[direction] += max(rate, 0.0) * MIB * dev.gpm.interval_s   # MiB/s -> bytes

    def pcie(self, dev: Device, now: float) -> list[Reading]:
        """PCIe bytes: GPM's PCIe rates integrated over its sample intervals where GPM gives them,
        else NVML's throughput samples (read apart from the round: each sleeps 20 ms in the driver)."""
        if self.pcie_from_gpm(dev):
            attrs = dev.direction_attrs
            return [new_reading(Reading, (N.GPU_PCIE_IO, total, attrs[direction]))
                    for direction, total in dev.pcie_bytes.items()]
        if "pcie_transmit" in dev.unsupported and "pcie_receive" in dev.unsupported:
            return []
        return self._costly(dev, dev.costly["pcie"], now, self._read_pcie)

    def _read_pcie(self, dev: Device) -> list[Reading]:
        """Both directions' throughput samples (KB/s, KB = 1024 bytes), integrated (trapezoid)
        between the times the calls were made."""
        nvml, out = self._nvml, []
        for direction, counter in (("transmit", nvml.NVML_PCIE_UTIL_TX_BYTES), ("receive", nvml.NVML_PCIE_UTIL_RX_BYTES)):
            t = self._clock()
            rate = self._call(dev, f"pcie_{direction}", "nvmlDeviceGetPcieThroughput", dev.handle, counter)
            if rate is SKIP:
                continue
            last = dev.pcie_last.get(direction)
            if last is not None:
                dev.pcie_bytes[direction] += (last[0] + rate) / 2.0 * KIB * max(t - last[1], 0.0)
            dev.pcie_last[direction] = (float(rate), t)
            out.append(Reading(N.GPU_PCIE_IO, dev.pcie_bytes[direction], dev.tagged(N.DIRECTION, direction)))
        slow = dev.costly.get("pcie")
        if slow is not None:
            slow.read_at = t
        return out

    # ---- doctor ------------------------------------------------------------------------
    def time_calls(self) -> None:
        """For doctor's per-call costs: each getter of each live GPU timed again until STEADY_CALLS calls after
        its first are timed, and the PCIe throughput call, not made where GPM gives PCIe rates, timed on one GPU
        so its cost shows too."""
        live = [d for d in self._devices if d.probed and not d.failed]
        for d in live[:1]:
            if "pcie_transmit" not in d.costs and "pcie_transmit" not in d.unsupported:
                fn = getattr(self._nvml, "nvmlDeviceGetPcieThroughput", None)
                try:
                    if fn is not None:
                        timed(d.costs, "pcie_transmit", "nvmlDeviceGetPcieThroughput", fn, d.handle,
                              self._nvml.NVML_PCIE_UTIL_TX_BYTES)
                except pynvml.NVMLError as err:
                    d.costs.pop("pcie_transmit", None)
                    if E.classify(err) == E.UNSUPPORTED:
                        d.unsupported["pcie_transmit"] = E.describe_error(err)
        for d in live:
            for name in list(d.costs):
                _time_again(d, name)

    def field_costs(self) -> list[dict]:
        """Per field: its NVML call, its cost on this node (median over the GPUs) and how often it is read. The
        cost of a call (ms, wall and CPU) is the median of the calls after the first (`time_calls` makes them);
        the first call, which carries NVML's one-time set-up, is shown apart (`first_ms`, wall). A field
        whose calls after the first were not timed (a GPM sample: each one is an interval of GPM's own) has no
        per-call cost (None)."""
        live = [d for d in self._devices if d.probed and not d.failed]
        rows = []
        for name in FIELDS + ("gpm",):
            costs = [d.costs[name] for d in live if name in d.costs]
            steady = [c for c in costs if c.steady]
            unsupported = bool(live) and all(name in d.unsupported for d in live)
            rows.append({"field": name, "call": costs[0].call.replace("nvmlDevice", "") if costs else CALLS.get(name, "-"),
                         "wall_ms": _ms(median(c.wall_s for c in steady)) if steady else None,
                         "cpu_ms": _ms(median(c.cpu_s for c in steady)) if steady else None,
                         "first_ms": _ms(median(c.first_wall_s for c in costs)) if costs else None,
                         "read": "unsupported" if unsupported else self._how_read(name, live)})
        return rows

    def _how_read(self, name: str, live: list[Device]) -> str:
        def period(key: str) -> float:
            return max((d.costly[key].period_s for d in live if key in d.costly), default=0.0)

        if name == "energy" and period("energy"):
            return f"every {period('energy'):.0f} s, background (costly)"
        if name in ("pcie_transmit", "pcie_receive"):
            if live and all(self.pcie_from_gpm(d) for d in live):
                return "every sample, from GPM"
            return f"every {period('pcie'):.0f} s, background (costly)" if self.cadence else \
                f"every {PCIE_MIN_INTERVAL_S:g} s"
        if name in ("power_limit", "ecc_corrected", "ecc_uncorrected", "row_remap", "retired_pages", "nvlink_errors",
                    "pcie_replay", "pcie_link"):
            return f"every {SLOW_READ_S:g} s (rarely changes)"
        if name == "mig":
            return f"at start; MIG listed every {MIG_RESCAN_S:g} s"
        if name == "gpm":
            return gpm_how_read(self.interval_s)
        return "every sample"


def _time_again(dev: Device, name: str) -> None:
    """Time `dev`'s getter of field `name` again until STEADY_CALLS calls after its first are timed (getters
    only: they change nothing; an error ends it, the sampling round judges errors)."""
    cost = dev.costs[name]
    if cost.again is None or not cost.call.startswith("nvmlDeviceGet") or name in dev.unsupported:
        return
    fn, args = cost.again
    try:
        while len(cost.walls) < STEADY_CALLS:
            timed(dev.costs, name, cost.call, fn, *args)
    except pynvml.NVMLError:
        return


def gpm_how_read(interval_s: float | None) -> str:
    """How often GPM is sampled when the source is read every `interval_s` (None: irregularly)."""
    if interval_s is None:
        return f"every sample (> {gpm_mod.MIN_INTERVAL_S:g} s apart)"
    k = int(gpm_mod.sample_spacing(interval_s) // interval_s) + 1
    if k == 1:
        return "every sample"
    return f"every {k} samples ({k * interval_s:.3g} s: GPM needs > {gpm_mod.MIN_INTERVAL_S:g} s)"
