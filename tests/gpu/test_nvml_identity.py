"""The maximum clocks and the driver version (read with the health fields every 10 s; what the job
consistency check compares): on the fake, through pynvml's own wrappers on the C stand-in, and
(marked gpu) on real NVML."""
from __future__ import annotations

from otel_gpu import names as N
from otel_gpu.sources.nvml import NvmlSource

from .conftest import select


def test_clock_limits_and_driver_on_any_backend(backend):
    kind, nvml = backend
    src = NvmlSource(nvml=nvml)
    try:
        readings = src.read()
        desc = src.describe()
    finally:
        src.close()
    whole = [g for g in desc["gpus"] if g["status"] == "ok"]
    limits = {(r.attributes[N.HW_ID], r.attributes[N.CLOCK_DOMAIN]): r.value
              for r in select(readings, N.GPU_CLOCK_LIMIT.name)}
    if kind != "real":   # the fake and the stand-in both answer it
        assert all("clock_max" in g["supported"] for g in whole)
    if all("clock_max" in g["supported"] for g in whole):
        assert {u for u, _ in limits} == {g["uuid"] for g in whole}
        clocks = {(r.attributes[N.HW_ID], r.attributes[N.CLOCK_DOMAIN]): r.value for r in select(readings, N.GPU_CLOCK.name)}
        for key, hz in limits.items():
            assert 100e6 <= hz <= 10e9, (key, hz)               # Hz, not MHz
            assert clocks.get(key, 0) <= hz, (key, clocks.get(key), hz)   # the current clock is within it
    else:   # said why, never 0
        assert all("clock_max" in g["unsupported"] for g in whole if "clock_max" not in g["supported"])
    drivers = select(readings, N.GPU_DRIVER.name)
    assert {r.attributes[N.HW_ID] for r in drivers} == {g["uuid"] for g in whole}
    assert {(r.value, r.attributes[N.DRIVER_VERSION]) for r in drivers} == {(1.0, desc["driver_version"])}
    assert "gpus_alike" in desc or "gpus_unlike" in desc
