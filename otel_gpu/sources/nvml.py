"""NVIDIA GPUs through NVML: utilization, memory, power, energy, temperature, clocks,
clock-event reasons, ECC and XID errors, PCIe and NVLink bytes, per-process memory,
MIG devices, and GPM metrics on Hopper and newer (see gpm.py).

The NVML module is a constructor argument: the real `pynvml` or a `FakeNvml`.
Capabilities are probed once per device: a call answered NOT_SUPPORTED is never
made again and its metric is left out (never reported as 0). A GPU that is lost
is marked failed (`hw.status`) and no longer read; the other GPUs keep reporting.

Costly calls never stall the sampling round (nvml_costs.py reads them at the cadence
nvml_cadence.py sets; nvml_device.py holds a device's state and makes each call): the energy counter is read
in the background, every 10 s or less often as the node's GPU count and measured call cost
require, and PCIe bytes come from GPM's PCIe rates where GPM gives them (else from PCIe
throughput samples taken in the background). `cadence=False` reads every field in every
round instead (the reference the cadence is checked against).
"""
from __future__ import annotations

import socket
import threading
import time
from functools import partial

import pynvml

from .. import names as N
from ..readings import SLOW_READ_S, Reading, SourceError, new_reading
from . import gpm as gpm_mod
from . import nvml_errors as E
from .nvml_cadence import BUDGET_CPU, timed
from .nvml_costs import FIELDS, CostlyFields
from .nvml_device import (CLOCK_FNS, CLOCK_REASONS, KIB, MIG_RESCAN_S, SKIP, Device, DeviceLost, call,
                          clock_reason_items, clock_reason_values, mig_profile, text)
from .nvml_health import health_readings
from .nvml_peaks import peak_readings
from .nvml_procs import GpuProcesses

_VALUE_FIELD = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}  # by valueType
__all__ = ["CLOCK_REASONS", "MIG_RESCAN_S", "NvmlSource", "clock_reason_values", "mig_profile"]


class NvmlSource:
    """Reads every NVIDIA GPU through `nvml` (module `pynvml` or a `FakeNvml`).

    `proc_root` is where process ranks and names are read; `clock` returns seconds
    (monotonic) and times PCIe integration and GPM sampling; `gpm=False` turns GPM off;
    `interval_s` is how often `read()` is called (s), if regularly: GPM then samples every read,
    or every other read below ~0.11 s (GPM needs more than 100 ms between samples; see
    gpm.sample_spacing); None samples at every read more than 100 ms after the last sample.
    `cadence=True` reads costly fields apart from the round (see nvml_cadence.py): in a
    background thread with `background=True` (the agent), else within `read()` when due;
    together they use at most `budget_cpu` of one core.
    Raises `SourceError` (one line) when NVML cannot start or finds no GPU.
    """

    name = "nvml"

    def __init__(self, nvml=pynvml, proc_root: str = "/proc", clock=time.monotonic, gpm: bool = True,
                 cadence: bool = True, background: bool = False, budget_cpu: float = BUDGET_CPU,
                 interval_s: float | None = None, pod_resources=None):
        self._nvml, self._clock, self._gpm_on = nvml, clock, gpm
        self.pod_resources = pod_resources   # a started podresources.PodResourcesReader, or None
        # _call(dev, field, fn_name, *args): nvml.<fn_name>(*args), or SKIP when unsupported
        # (remembered) or failing now (counted); see nvml_device.call
        self._call = partial(call, nvml, self._error)
        self._interval_s = interval_s
        self._errors = 0
        self._errors_lock = threading.Lock()
        self._pids: set[int] = set()
        self._procs = GpuProcesses(self._call, proc_root, pod_resources.owners if pod_resources else None)
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise SourceError(E.init_error_line(err)) from None
        self._closed = False
        try:
            self.driver = text(nvml.nvmlSystemGetDriverVersion())
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
        self._costly = CostlyFields(nvml, self.devices, self._call, clock, cadence, background, budget_cpu,
                                    interval_s)

    def _open(self, i: int) -> Device:
        nvml = self._nvml
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            dev = Device(i, h, text(nvml.nvmlDeviceGetUUID(h)), text(nvml.nvmlDeviceGetName(h)))
        except pynvml.NVMLError as err:
            dev = Device(i, None, f"nvidia-gpu-index-{i}", "unknown NVIDIA GPU")
            dev.failed = E.describe_error(err)
            self._error()
        return dev

    @property
    def partial_errors(self) -> int:
        """Partial failures so far (a field, a GPU), from the sampling round and background reads."""
        return self._errors + self._costly.errors

    @property
    def error_reasons(self) -> dict[str, int]:
        """Errors counted apart from `partial_errors`, by `error.type`: NVML PIDs dropped (gpu_owner.py)."""
        return dict(self._procs.dropped_counts)

    def _error(self, n: int = 1) -> None:
        with self._errors_lock:   # background reads count here too
            self._errors += n

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
        if self._xid.errors != failed_waits:
            self._error(self._xid.errors - failed_waits)
        for dev in self.devices:
            if dev.lost_pending and not dev.failed:
                self._mark_lost(dev, dev.lost_pending)
            if not dev.failed:
                try:
                    if not dev.probed:
                        self._probe(dev)
                    out.extend(self._read_device(dev, now, pids))
                except DeviceLost as lost:
                    self._mark_lost(dev, str(lost))
            if dev.failed:
                dev.labels.set(())   # a lost GPU runs no job
            out.extend(dev.labels.apply(self._status(dev)))
        self._pids = pids
        self._procs.keep(pids)
        return out

    def gpu_pids(self) -> set[int]:
        """PIDs using a GPU in the last read."""
        return set(self._pids)

    def _mark_lost(self, dev: Device, reason: str) -> None:
        dev.failed = reason
        self._error()
        if dev.gpm is not None:
            dev.gpm.close()
            dev.gpm = None

    @staticmethod
    def _status(dev: Device) -> tuple[Reading, Reading]:
        """hw.status ok / failed (built once per device and state: readings are immutable)."""
        ok = 0 if dev.failed else 1
        status = dev.status.get(ok)
        if status is None:
            status = dev.status[ok] = (Reading(N.GPU_STATUS, ok, dev.tagged(N.HW_STATE, "ok")),
                                       Reading(N.GPU_STATUS, 1 - ok, dev.tagged(N.HW_STATE, "failed")))
        return status

    # ---- probing (once per device) ---------------------------------------------
    def _probe(self, dev: Device) -> None:
        nvml = self._nvml
        mode = self._call(dev, "mig", "nvmlDeviceGetMigMode", dev.handle)
        enabled = mode is not SKIP and mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        dev.mig_mode = "unsupported" if mode is SKIP else ("enabled" if enabled else "disabled")
        if enabled:
            self._enumerate_migs(dev, self._clock())
        links = self._field_values(dev, "nvlink", [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
        dev.nvlink = bool(links and links[0])
        dev.nvlinks = int(links[0]) if dev.nvlink else 0
        if not dev.nvlink:
            dev.unsupported.setdefault("nvlink", "no NVLink")
        try:
            reason = self._xid.register(dev.handle)
        except pynvml.NVMLError as err:
            raise DeviceLost(E.describe_error(err)) from None
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
                    dev.gpm = gpm_mod.GpmDevice(nvml, dev.handle, gpm_mod.sample_spacing(self._interval_s)
                                                if self._interval_s else gpm_mod.MIN_INTERVAL_S)
                except pynvml.NVMLError as err:
                    if E.classify(err) == E.LOST:
                        raise DeviceLost(E.describe_error(err)) from None
                    dev.gpm_status = f"sample allocation failed ({E.describe_error(err)})"
        self._costly.setup(dev)
        dev.probed = True

    def _enumerate_migs(self, dev: Device, now: float) -> None:
        """List `dev`'s MIG devices; those listed before (same UUID) keep their state."""
        nvml = self._nvml
        known = {m.uuid: m for m in dev.migs}
        migs = []
        count = self._call(dev, "mig_devices", "nvmlDeviceGetMaxMigDeviceCount", dev.handle)
        for i in range(0 if count is SKIP else count):
            try:
                h = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
                uuid = text(nvml.nvmlDeviceGetUUID(h))
                mig = known.get(uuid)
                if mig is None:
                    mig = Device(dev.index, h, uuid, text(nvml.nvmlDeviceGetName(h)), dev)
                mig.handle = h
            except pynvml.NVMLError as err:
                if E.classify(err) == E.LOST:
                    raise DeviceLost(E.describe_error(err)) from None
                continue  # NOT_FOUND: no MIG device in this slot
            migs.append(mig)
        dev.migs = migs
        dev.migs_listed_at = now

    # ---- reading one device ----------------------------------------------------
    def _read_device(self, dev: Device, now: float, pids: set[int]) -> list[Reading]:
        nvml, a, out = self._nvml, dev.attrs, []
        add = out.append
        h = dev.handle
        task = dev.task_attrs
        u = self._call(dev, "utilization", "nvmlDeviceGetUtilizationRates", h)
        if u is not SKIP:
            add(new_reading(Reading, (N.GPU_UTILIZATION, u.gpu / 100.0, task)))
            add(new_reading(Reading, (N.GPU_MEMORY_UTILIZATION, u.memory / 100.0, task)))
        out.extend(self._memory(dev))
        p = self._call(dev, "power", "nvmlDeviceGetPowerUsage", h)
        if p is not SKIP:
            add(new_reading(Reading, (N.GPU_POWER, p / 1000.0, a)))   # mW -> W
        out.extend(self._costly.energy(dev, now))
        t = self._call(dev, "temperature", "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
        if t is not SKIP:
            add(new_reading(Reading, (N.GPU_TEMPERATURE, float(t), a)))
        for field, clock, attrs in (("clock_sm", nvml.NVML_CLOCK_SM, dev.clock_attrs[0]),
                                    ("clock_memory", nvml.NVML_CLOCK_MEM, dev.clock_attrs[1])):
            c = self._call(dev, field, "nvmlDeviceGetClockInfo", h, clock)
            if c is not SKIP:
                add(new_reading(Reading, (N.GPU_CLOCK, c * 1e6, attrs)))   # MHz -> Hz
        mask = self._clock_events(dev)
        if mask is not SKIP:
            out.extend(self._clock_event_readings(dev, int(mask)))
        out.extend(self._slow(dev, now))
        out.extend(peak_readings(dev))
        for code, n in sorted(dev.xid.items()):
            add(Reading(N.GPU_ERRORS, float(n), dev.tagged(N.ERROR_TYPE, f"xid_{code}")))
        if dev.gpm is not None:
            out.extend(self._gpm(dev, now))   # before PCIe: its PCIe rates feed the PCIe byte counters
        out.extend(self._costly.pcie(dev, now))
        out.extend(self._nvlink(dev))
        if dev.mig_mode == "enabled" and now - dev.migs_listed_at >= MIG_RESCAN_S:
            self._enumerate_migs(dev, now)   # an admin may have created or destroyed MIG devices
        if not dev.migs:
            procs = self._procs.readings(dev, pids)   # sets dev.labels: its series carry the job using it
            return dev.labels.apply(out) + procs
        migs = []
        for mig in dev.migs:
            procs = self._procs.readings(mig, pids)
            migs += mig.labels.apply(self._memory(mig) + peak_readings(mig)) + procs
        owners = {m.labels.owner for m in dev.migs if m.labels.owner}   # the GPU's: its MIG devices' one owner
        dev.labels.set(owners.pop() if len(owners) == 1 else ())
        return dev.labels.apply(out) + migs

    @staticmethod
    def _clock_event_readings(dev: Device, mask: int) -> list[Reading]:
        """One reading per reason, built once per mask and device (masks rarely change)."""
        readings = dev.by_mask.get(mask)
        if readings is None:
            if len(dev.by_mask) > 64:
                dev.by_mask.clear()
            readings = dev.by_mask[mask] = [Reading(N.GPU_CLOCK_EVENT, active, dev.tagged(N.CLOCK_REASON, reason))
                                            for reason, active in clock_reason_items(mask)]
        return readings

    def _clock_events(self, dev: Device):
        """The clock-event reason mask; drivers older than the 'EventReasons' name get the 'Throttle' one."""
        mask = self._call(dev, "clock_events", dev.clock_fn, dev.handle)
        reason = dev.unsupported.get("clock_events", "")
        if mask is SKIP and dev.clock_fn == CLOCK_FNS[0] and reason.startswith(("Function Not Found", CLOCK_FNS[0])):
            del dev.unsupported["clock_events"]
            dev.clock_fn = CLOCK_FNS[1]
            mask = self._call(dev, "clock_events", dev.clock_fn, dev.handle)
        return mask

    def _memory(self, dev: Device) -> list[Reading]:
        m = self._call(dev, "memory", "nvmlDeviceGetMemoryInfo", dev.handle)
        if m is SKIP:
            return []
        dev.memory_total = m.total
        return [new_reading(Reading, (N.GPU_MEMORY_USAGE, float(m.used), dev.attrs)),
                new_reading(Reading, (N.GPU_MEMORY_LIMIT, float(m.total), dev.attrs))]

    def _slow(self, dev: Device, now: float) -> list[Reading]:
        """Power limit, volatile ECC totals, health (nvml_health.py), maximum clocks and driver version: they change
        by an admin's action or rarely, so they are read every SLOW_READ_S seconds and the same readings repeated
        in between."""
        if dev.slow is not None and now - dev.slow[0] < SLOW_READ_S:
            return dev.slow[1]
        nvml, out = self._nvml, []
        p = self._call(dev, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", dev.handle)
        if p is not SKIP:
            out.append(Reading(N.GPU_POWER_LIMIT, p / 1000.0, dev.attrs))      # mW -> W
        for kind, etype in (("ecc_corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                            ("ecc_uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            n = self._call(dev, kind, "nvmlDeviceGetTotalEccErrors", dev.handle, etype, nvml.NVML_VOLATILE_ECC)
            if n is not SKIP:
                out.append(Reading(N.GPU_ERRORS, float(n), dev.tagged(N.ERROR_TYPE, kind)))
        out += health_readings(nvml, self._call, dev, dev.nvlinks, self._error)   # row remap, NVLink/PCIe errors, link
        for clock, attrs in ((nvml.NVML_CLOCK_SM, dev.clock_attrs[0]), (nvml.NVML_CLOCK_MEM, dev.clock_attrs[1])):
            c = self._call(dev, "clock_max", "nvmlDeviceGetMaxClockInfo", dev.handle, clock)
            if c is not SKIP:
                out.append(Reading(N.GPU_CLOCK_LIMIT, c * 1e6, attrs))   # MHz -> Hz
        out.append(Reading(N.GPU_DRIVER, 1.0, dev.tagged(N.DRIVER_VERSION, self.driver[:64])))
        dev.slow = (now, out)
        return out

    def _field_values(self, dev: Device, field: str, ids: list) -> list[float] | None:
        """Values of NVML field ids (None when the call or any field is unsupported)."""
        vals = self._call(dev, field, "nvmlDeviceGetFieldValues", dev.handle, ids)
        if vals is SKIP:
            return None
        out = []
        for v in vals:
            if v.nvmlReturn != pynvml.NVML_SUCCESS:
                dev.unsupported[field] = E.describe_error(pynvml.NVMLError(v.nvmlReturn))
                return None
            out.append(float(getattr(v.value, _VALUE_FIELD.get(v.valueType, "ullVal"))))
        return out

    def _nvlink(self, dev: Device) -> list[Reading]:
        """NVLink data bytes, all links (NVML's cumulative KiB counters, scope 0 = GPU-wide)."""
        if not dev.nvlink:
            return []
        nvml = self._nvml
        vals = self._field_values(dev, "nvlink", [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
                                                  (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0)])
        if vals is None:
            return []
        attrs = dev.direction_attrs
        return [new_reading(Reading, (N.GPU_NVLINK_IO, vals[0] * KIB, attrs["transmit"])),
                new_reading(Reading, (N.GPU_NVLINK_IO, vals[1] * KIB, attrs["receive"]))]

    def _gpm(self, dev: Device, now: float) -> list[Reading]:
        """GPM readings; between two samples (see gpm.sample_spacing) the last ones, as they were."""
        if not dev.gpm.due(now):
            return dev.gpm_out
        try:
            if "gpm" in dev.settled:
                values = dev.gpm.sample(now)
            else:
                values = timed(dev.costs, "gpm", "nvmlGpmSampleGet", dev.gpm.sample, now)
                if dev.costs["gpm"].known:
                    dev.settled.add("gpm")
        except pynvml.NVMLError as err:
            kind = E.classify(err)
            if kind == E.LOST:
                raise DeviceLost(E.describe_error(err)) from None
            if kind == E.UNSUPPORTED:
                dev.gpm_status = f"unsupported ({E.describe_error(err)})"
                dev.gpm.close()
                dev.gpm = None
            else:
                dev.errors["gpm"] = E.describe_error(err)
                self._error()
            return []
        self._costly.add_gpm_rates(dev, values)   # new rates over a new interval: PCIe bytes grow
        plan = dev.gpm_plan
        if plan is None or plan[0] != tuple(values):   # worked out once for the metrics this GPU gives
            plan = dev.gpm_plan = gpm_mod.reading_plan(tuple(values), dev.attrs, nvlink=dev.nvlink,
                                                       tagged=dev.tagged)
        dev.gpm_out = gpm_mod.planned_readings(plan, values)
        return dev.gpm_out

    # ---- doctor ------------------------------------------------------------------
    def time_calls(self) -> None:
        """Time each NVML getter again (after a first read where none was made) so that describe()'s
        field costs are per-call costs, the first call's one-time set-up left out (nvml_costs.py)."""
        self._probed()
        self._costly.time_calls()

    def _probed(self) -> None:
        """Every GPU probed (a read where none was made) and its background reads finished, so their costs show."""
        if any(not d.probed and not d.failed for d in self.devices):
            self.read()
        deadline = time.monotonic() + 2.0   # background reads in flight: let them finish so their costs show
        while time.monotonic() < deadline and self._costly.pending():
            time.sleep(0.01)

    def describe(self) -> dict:
        """Driver, each GPU (name, UUID, index, MIG mode) and which metric groups it has."""
        self._probed()
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
                "partial_errors": self.partial_errors, "gpus": gpus, **self._alike(),
                **({"pod_resources": self.pod_resources.describe()} if self.pod_resources else {}),
                "field_costs": self._costly.field_costs(),
                "dropped_processes": {str(pid): why for pid, why in sorted(self._procs.dropped.items())}}

    def _alike(self) -> dict:
        """doctor: are this node's GPUs alike, and each job's (where the GPU processes name one)? Model, memory,
        maximum PCIe generation (the current one drops while idle), current PCIe width and maximum SM clock,
        as last read (no NVML call of its own: a describe() is not a read)."""
        from ..diagnose.consistency import unlike
        from ..diagnose.model import GpuStats

        stats, jobs, host = [], {}, socket.gethostname()
        for d in self.devices:
            if d.failed or not d.probed:
                continue
            last = {(r.spec.name, r.attributes.get(N.CLOCK_DOMAIN, "sm")): r.value for r in (d.slow or (0, []))[1]}
            g = GpuStats(host=host, gpu=str(d.index), uuid=d.uuid, model=d.name,
                         mem_limit_b=float(d.memory_total) if d.memory_total else None,
                         pcie_gen=last.get((N.GPU_PCIE_LINK_GENERATION_MAX.name, "sm")),
                         pcie_width=last.get((N.GPU_PCIE_LINK_WIDTH.name, "sm")),
                         sm_clock_limit_hz=last.get((N.GPU_CLOCK_LIMIT.name, "sm")))
            stats.append(g)
            if d.labels.owner:
                jobs.setdefault(", ".join(f"{k}={v}" for k, v in d.labels.owner), []).append(g)
        if len(stats) < 2:
            return {"gpus_alike": f"not checked: {len(stats)} GPU{'' if len(stats) == 1 else 's'} read"}
        rows = unlike({"all of this node": stats, **{f"job {j}": gs for j, gs in sorted(jobs.items()) if len(gs) > 1}})
        if rows:
            return {"gpus_unlike": rows}
        return {"gpus_alike": f"yes: {len(stats)} GPUs alike in model, memory, maximum PCIe generation, PCIe width "
                              "and maximum SM clock (one driver per node)"}

    def close(self) -> None:
        """Free GPM samples and the event set, then `nvmlShutdown` (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if getattr(self, "pod_resources", None) is not None:
            self.pod_resources.stop()
        if hasattr(self, "_costly"):
            self._costly.close()
        for d in getattr(self, "devices", []):
            if d.gpm is not None:
                d.gpm.close()
                d.gpm = None
        try:
            if hasattr(self, "_xid"):
                self._xid.close()
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError:
            self._error()
