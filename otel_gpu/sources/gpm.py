"""GPU Performance Monitoring (NVML GPM, Hopper and newer): SM activity, occupancy,
tensor activity, DRAM bandwidth, NVLink and PCIe rates.

GPM metrics are computed between two samples taken more than 100 ms apart. One
`GpmDevice` per GPU keeps two samples (allocated once) and swaps them: each
`sample()` takes a new one and computes the metrics since the previous one. When
called again within `min_interval` (see `sample_spacing`) it returns the last computed values
unchanged.
Used by `NvmlSource`, which owns `nvmlInit` and the device handles.
"""
from __future__ import annotations

import math

from ..names import (
    DIRECTION, GPU_DRAM_ACTIVITY, GPU_NVLINK_RATE, GPU_PCIE_RATE,
    GPU_SM_ACTIVITY, GPU_SM_OCCUPANCY, GPU_TENSOR_ACTIVITY,
)
from ..readings import Reading, new_reading
from . import nvml_errors
from .gpm_request import MetricsRequest

MIB = 1024 * 1024
MIN_INTERVAL_S = 0.1  # NVML: GPM samples must be more than 100 ms apart

# metric constant name -> (spec, scale to the spec's unit, direction or None)
_METRICS = {
    "NVML_GPM_METRIC_SM_UTIL": (GPU_SM_ACTIVITY, 0.01, None),           # % -> 1
    "NVML_GPM_METRIC_SM_OCCUPANCY": (GPU_SM_OCCUPANCY, 0.01, None),     # % -> 1
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": (GPU_TENSOR_ACTIVITY, 0.01, None),
    "NVML_GPM_METRIC_DRAM_BW_UTIL": (GPU_DRAM_ACTIVITY, 0.01, None),
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": (GPU_NVLINK_RATE, MIB, "transmit"),  # MiB/s -> By/s
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": (GPU_NVLINK_RATE, MIB, "receive"),
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": (GPU_PCIE_RATE, MIB, "transmit"),
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": (GPU_PCIE_RATE, MIB, "receive"),
}


def sample_spacing(interval_s: float) -> float:
    """Seconds a GPM sample waits after the last one when the source is read every `interval_s`:
    every read when reads are more than MIN_INTERVAL_S apart (with 10% to spare), else every k-th
    read, k the fewest reads spanning more than that (0.1 s: every other read, 0.2 s apart). Half
    a read of slack absorbs the jitter of the reads' times, so the choice is the same every time."""
    k = max(1, math.ceil(MIN_INTERVAL_S * 1.1 / interval_s))
    return max(MIN_INTERVAL_S, (k - 0.5) * interval_s)


def metric_ids(nvml) -> dict[int, str]:
    """GPM metric id -> constant name, for the metrics this module reports."""
    return {getattr(nvml, n): n for n in _METRICS if hasattr(nvml, n)}


def gpm_readings(values: dict[str, float], attrs: dict[str, str], *, nvlink: bool = True,
                 tagged=None) -> list[Reading]:
    """Readings from raw GPM values keyed by constant name (percent, MiB/s).

    Percentages become fractions clamped to 0..1; MiB/s become bytes/s. NVLink
    rates are left out when the GPU has no NVLink (`nvlink=False`). `tagged(key, value)`,
    when given, returns `attrs` plus one attribute (a cached dict the readings share).
    """
    return planned_readings(reading_plan(tuple(values), attrs, nvlink=nvlink, tagged=tagged), values)


def reading_plan(metrics: tuple[str, ...], attrs: dict[str, str], *, nvlink: bool = True,
                 tagged=None) -> tuple:
    """(metrics, [(name, spec, scale, is a ratio, attributes)]): how `gpm_readings` turns values
    of these metrics (in this order) into readings, worked out once for a device's metrics."""
    plan = []
    for name in metrics:
        spec, scale, direction = _METRICS[name]
        if spec is GPU_NVLINK_RATE and not nvlink:
            continue
        if not direction:
            a = attrs
        elif tagged is not None:
            a = tagged(DIRECTION, direction)
        else:
            a = {**attrs, DIRECTION: direction}
        plan.append((name, spec, scale, spec.unit == "1", a))
    return metrics, plan


def planned_readings(plan: tuple, values: dict[str, float]) -> list[Reading]:
    """`gpm_readings(values, ...)` by a `reading_plan` made for `values`' metrics (see there)."""
    out = []
    for name, spec, scale, ratio, a in plan[1]:
        value = values[name] * scale
        if ratio:
            value = min(max(value, 0.0), 1.0)
        out.append(new_reading(Reading, (spec, max(value, 0.0), a)))
    return out


def query_support(nvml, handle) -> tuple[bool, str]:
    """(supported, reason) from `nvmlGpmQueryDeviceSupport`; LOST errors propagate."""
    fn = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)
    if fn is None:
        return False, "nvidia-ml-py has no GPM"
    try:
        support = fn(handle)
    except nvml_errors.pynvml.NVMLError as err:
        if nvml_errors.classify(err) == nvml_errors.LOST:
            raise
        return False, nvml_errors.describe_error(err)
    if not getattr(support, "isSupportedDevice", 0):
        return False, "not supported on this GPU (GPM needs Hopper or newer)"
    return True, "supported"


class GpmDevice:
    """Two GPM samples of one GPU and the metrics computed between them.

    NVML errors from `sample()` propagate (the caller classifies them).
    """

    def __init__(self, nvml, handle, min_interval: float = MIN_INTERVAL_S):
        min_interval = max(min_interval, MIN_INTERVAL_S)
        self._nvml = nvml
        self._handle = handle
        self.min_interval = min_interval   # s: a sample() sooner than this after the last returns the last values
        self._ids = metric_ids(nvml)
        self._prev = nvml.nvmlGpmSampleAlloc()
        self._cur = nvml.nvmlGpmSampleAlloc()
        self._prev_t: float | None = None
        self._request = MetricsRequest(nvml)
        self.values: dict[str, float] = {}   # last computed values, raw NVML units
        self.computed = 0                    # computations so far (each over a new interval)
        self.interval_s = 0.0                # seconds between the two samples of the last computation
        self.unsupported: set[str] = set()   # metrics NVML answered NOT_SUPPORTED for

    def due(self, now: float) -> bool:
        """A sample at `now` (seconds) would be taken (not within `min_interval` of the last)."""
        return self._prev_t is None or now - self._prev_t > self.min_interval

    def sample(self, now: float) -> dict[str, float]:
        """Take a sample at `now` (seconds) and return the metrics since the last one."""
        if not self.due(now):
            return self.values
        self._nvml.nvmlGpmSampleGet(self._handle, self._cur)
        if self._prev_t is not None:
            self.values = self._compute()
            self.interval_s = now - self._prev_t
            self.computed += 1
        self._prev, self._cur = self._cur, self._prev
        self._prev_t = now
        return self.values

    def _compute(self) -> dict[str, float]:
        nvml = self._nvml
        ids = tuple(i for i, n in self._ids.items() if n not in self.unsupported)
        values = {}
        for mid, ret, value in self._request.run(ids, self._prev, self._cur):
            name = self._ids.get(mid)
            if name is None:
                continue
            if ret == nvml.NVML_SUCCESS:
                values[name] = float(value)
            elif ret in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                self.unsupported.add(name)
        return values

    def close(self) -> None:
        """Free both samples (errors ignored: the GPU may be gone)."""
        for s in (self._prev, self._cur):
            try:
                self._nvml.nvmlGpmSampleFree(s)
            except nvml_errors.pynvml.NVMLError:
                pass
