"""Assertions that hold for any NVIDIA machine: run on the fake and (marked gpu) on real NVML."""
from __future__ import annotations

import time

import pytest

from otel_gpu import names as N
from otel_gpu.readings import Source
from otel_gpu.sources.nvml import CLOCK_REASONS, NvmlSource

from .conftest import by_gpu, select

# describe()'s field names -> the metric they feed
FIELD_METRIC = {
    "utilization": N.GPU_UTILIZATION.name, "power": N.GPU_POWER.name, "power_limit": N.GPU_POWER_LIMIT.name,
    "energy": N.GPU_ENERGY.name, "temperature": N.GPU_TEMPERATURE.name, "clock_events": N.GPU_CLOCK_EVENT.name,
    "nvlink": N.GPU_NVLINK_IO.name,
}


def test_every_gpu_has_identity_memory_and_status(backend):
    kind, nvml = backend
    src = NvmlSource(nvml=nvml)
    try:
        assert isinstance(src, Source) and src.name == "nvml"
        readings = src.read()
        desc = src.describe()
    finally:
        src.close()
    assert desc["driver_version"] and desc["gpu_count"] == len(desc["gpus"]) >= 1
    uuids = {g["uuid"] for g in desc["gpus"]}
    assert all(u.startswith("GPU-") for u in uuids)
    assert set(by_gpu(readings, N.GPU_STATUS.name, hw__state="ok")) == uuids
    assert all(v == 1 for v in by_gpu(readings, N.GPU_STATUS.name, hw__state="ok").values())
    assert all(v == 0 for v in by_gpu(readings, N.GPU_STATUS.name, hw__state="failed").values())
    for r in readings:
        assert r.attributes["hw.vendor"] == "nvidia" and r.attributes["hw.type"] == "gpu"
        assert r.attributes["otelgpu.gpu.index"].isdigit()
    limits = by_gpu(readings, N.GPU_MEMORY_LIMIT.name)
    used = by_gpu(readings, N.GPU_MEMORY_USAGE.name)
    assert limits and all(4 * 2**30 <= v <= 512 * 2**30 for v in limits.values())   # bytes, not MiB
    assert all(0 <= used[u] <= limits[u] for u in limits)
    for u in by_gpu(readings, N.GPU_UTILIZATION.name).values():
        assert 0.0 <= u <= 1.0
    for w in by_gpu(readings, N.GPU_POWER.name).values():
        assert 5.0 < w < 2000.0                                                          # W, not mW
    for r in select(readings, N.GPU_CLOCK.name):
        assert 5e7 < r.value < 1e10                                                      # Hz, not MHz
    if kind == "fake":
        assert len(uuids) == 8 and desc["driver_version"] == "590.48.01"
        assert len(by_gpu(readings, N.GPU_UTILIZATION.name)) == 8


def test_unsupported_fields_are_absent_not_zero(backend):
    _, nvml = backend
    src = NvmlSource(nvml=nvml)
    try:
        readings = src.read() + src.read()
        desc = src.describe()
    finally:
        src.close()
    for gpu in desc["gpus"]:
        for field in gpu["unsupported"]:
            metric = FIELD_METRIC.get(field)
            if metric:
                assert not select(readings, metric, hw__id=gpu["uuid"]), f"{metric} reported though {field} unsupported"


@pytest.mark.parametrize("cadence", [True, False], ids=["cadence", "every-read"])
def test_energy_counter_is_monotonic(backend, cadence):
    kind, nvml = backend
    src = NvmlSource(nvml=nvml, cadence=cadence)
    try:
        seen = []
        for _ in range(3):
            seen.append(by_gpu(src.read(), N.GPU_ENERGY.name))
            time.sleep(0.05)
    finally:
        src.close()
    assert seen[0], "no energy reading in the first read"
    for gpu in seen[0]:
        values = [s[gpu] for s in seen]
        assert values == sorted(values)
        if kind == "fake" and not cadence:
            assert values[2] > values[0]
        if cadence:   # the costly counter is read once in 10 s and repeated in between
            assert values[0] == values[2]


def test_clock_event_reasons_are_all_present_as_0_or_1(backend):
    _, nvml = backend
    src = NvmlSource(nvml=nvml)
    try:
        readings = src.read()
    finally:
        src.close()
    events = select(readings, N.GPU_CLOCK_EVENT.name)
    for gpu in {r.attributes["hw.id"] for r in events}:
        reasons = {r.attributes[N.CLOCK_REASON]: r.value for r in events if r.attributes["hw.id"] == gpu}
        assert set(CLOCK_REASONS.values()) <= set(reasons)
        assert set(reasons.values()) <= {0, 1}


def test_pcie_byte_counters_never_go_back(backend):
    _, nvml = backend
    src = NvmlSource(nvml=nvml)
    try:
        first = src.read()
        time.sleep(0.05)
        second = src.read()
    finally:
        src.close()
    for direction in ("transmit", "receive"):
        a = by_gpu(first, N.GPU_PCIE_IO.name, network__io__direction=direction)
        b = by_gpu(second, N.GPU_PCIE_IO.name, network__io__direction=direction)
        assert a.keys() == b.keys()
        assert all(0 <= a[g] <= b[g] for g in a)


def test_gpm_metrics_where_supported_and_absent_elsewhere(backend):
    kind, nvml = backend
    src = NvmlSource(nvml=nvml)
    try:
        src.read()
        time.sleep(0.15)                       # GPM needs > 100 ms between samples
        readings = src.read()
        desc = src.describe()
    finally:
        src.close()
    for gpu in desc["gpus"]:
        sm = by_gpu(readings, N.GPU_SM_ACTIVITY.name).get(gpu["uuid"])
        if gpu["gpm"] == "supported":
            assert sm is not None and 0.0 <= sm <= 1.0
            for spec in (N.GPU_SM_OCCUPANCY, N.GPU_TENSOR_ACTIVITY, N.GPU_DRAM_ACTIVITY):
                v = by_gpu(readings, spec.name).get(gpu["uuid"])
                assert v is None or 0.0 <= v <= 1.0
        else:
            assert sm is None
    if kind == "fake":
        assert all(g["gpm"] == "supported" for g in desc["gpus"])


def test_cadence_reports_the_same_series_and_values_as_every_read(backend):
    """The costly fields read apart (energy in the background, PCIe from GPM) against every field
    every read: the same series, the same limits, gauges close, energy at most one read behind."""
    from otel_gpu.agent.store import attrs_key

    _, nvml = backend
    every, fast = NvmlSource(nvml=nvml, cadence=False), NvmlSource(nvml=nvml)
    try:
        for _ in range(3):
            a = {(r.spec.name, attrs_key(r.attributes)): r.value for r in every.read()}
            b = {(r.spec.name, attrs_key(r.attributes)): r.value for r in fast.read()}
            time.sleep(0.15)
    finally:
        every.close()
        fast.close()
    assert a.keys() == b.keys()
    for key, value in a.items():
        name = key[0]
        if name in (N.GPU_MEMORY_LIMIT.name, N.GPU_POWER_LIMIT.name, N.GPU_STATUS.name):
            assert b[key] == value, key
        elif name == N.GPU_ENERGY.name:
            assert 0 <= value - b[key] <= 2000.0 * 1.0, key          # J: <= 1 s behind at <= 2 kW
        elif name == N.GPU_PCIE_IO.name:
            assert value >= 0 and b[key] >= 0
        elif name in (N.GPU_UTILIZATION.name, N.GPU_SM_ACTIVITY.name, N.GPU_TENSOR_ACTIVITY.name):
            assert abs(b[key] - value) <= 0.3, key
