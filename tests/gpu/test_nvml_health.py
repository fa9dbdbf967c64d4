"""GPU health readings (row remapping, retired pages, NVLink and PCIe errors, PCIe link): scripted on the
fake, through pynvml's own wrappers on the C stand-in, and (marked gpu) on real NVML."""
from __future__ import annotations

from otel_gpu import names as N
from otel_gpu.readings import SLOW_READ_S
from otel_gpu.sources.fake_nvml import FakeGpu, FakeNvml, H100_MIG, a100, hopper
from otel_gpu.sources.nvml import NvmlSource
from otel_gpu.sources.nvml_health import FIELDS

from .conftest import StepClock, by_gpu, select

HEALTH = {N.GPU_REMAPPED_ROWS.name, N.GPU_ROW_REMAP_PENDING.name, N.GPU_ROW_REMAP_FAILED.name,
          N.GPU_RETIRED_PAGES.name, N.GPU_NVLINK_ERRORS.name, N.GPU_NVLINK_LINK_ERRORS.name, N.GPU_PCIE_REPLAYS.name,
          N.GPU_PCIE_LINK_GENERATION.name, N.GPU_PCIE_LINK_GENERATION_MAX.name,
          N.GPU_PCIE_LINK_WIDTH.name, N.GPU_PCIE_LINK_WIDTH_MAX.name}


def test_health_on_any_backend_is_sane_or_said_unsupported(backend):
    kind, nvml = backend
    src = NvmlSource(nvml=nvml)
    try:
        readings = src.read()
        desc = src.describe()
    finally:
        src.close()
    for gpu in desc["gpus"]:
        for field in FIELDS:   # each group is read or said unsupported, with the reason
            assert (field in gpu["supported"]) != (field in gpu["unsupported"]), (field, gpu)
    for name in (N.GPU_PCIE_LINK_GENERATION.name, N.GPU_PCIE_LINK_GENERATION_MAX.name):
        assert all(1 <= v <= 6 for v in by_gpu(readings, name).values())
    for name in (N.GPU_PCIE_LINK_WIDTH.name, N.GPU_PCIE_LINK_WIDTH_MAX.name):
        assert all(v in (1, 2, 4, 8, 16, 32) for v in by_gpu(readings, name).values())
    current, most = by_gpu(readings, N.GPU_PCIE_LINK_WIDTH.name), by_gpu(readings, N.GPU_PCIE_LINK_WIDTH_MAX.name)
    assert all(current[u] <= most[u] for u in current)
    for name in (N.GPU_ROW_REMAP_PENDING.name, N.GPU_ROW_REMAP_FAILED.name):
        assert set(by_gpu(readings, name).values()) <= {0.0, 1.0}
    assert all(r.value >= 0 for r in readings if r.spec.name in HEALTH)
    links = {r.attributes[N.NVLINK_LINK] for r in select(readings, N.GPU_NVLINK_LINK_ERRORS.name)}
    assert all(0 <= int(k) < 18 for k in links)
    if kind in ("fake", "stub"):   # a healthy Hopper at Gen5 x16 with 18 links
        assert set(current.values()) == {16} and set(by_gpu(readings, N.GPU_PCIE_LINK_GENERATION.name).values()) == {5}
        assert len(select(readings, N.GPU_NVLINK_ERRORS.name)) == 4 * len(desc["gpus"])   # all links' totals
        assert not select(readings, N.GPU_NVLINK_LINK_ERRORS.name)   # no link with an error: no per-link series
        assert all(g["unsupported"].get("retired_pages") for g in desc["gpus"])


def test_scripted_faults_show_within_one_slow_period():
    clock = StepClock()
    fake = FakeNvml(gpus=[hopper(nvlinks=2), hopper(nvlinks=2), a100(nvlinks=0)], clock=clock, costs={})
    src = NvmlSource(nvml=fake, clock=clock, cadence=False)
    try:
        first = src.read()
        uuids = [g["uuid"] for g in src.describe()["gpus"]]
        assert by_gpu(first, N.GPU_ROW_REMAP_PENDING.name) == dict.fromkeys(uuids, 0.0)
        fake.set_health(1, remapped_rows=(3, 1, True, False), pcie_replays=7, pcie_link=(3, 4, 5, 16),
                        nvlink_errors=((0, 0, 0, 0), (5, 1, 9, 2)))
        clock.t += SLOW_READ_S / 2
        assert by_gpu(src.read(), N.GPU_PCIE_REPLAYS.name)[uuids[1]] == 0   # repeated until the next slow read
        clock.t += SLOW_READ_S / 2
        now = src.read()
    finally:
        src.close()
    assert by_gpu(now, N.GPU_REMAPPED_ROWS.name, error__type="correctable")[uuids[1]] == 3
    assert by_gpu(now, N.GPU_REMAPPED_ROWS.name, error__type="uncorrectable")[uuids[1]] == 1
    assert by_gpu(now, N.GPU_ROW_REMAP_PENDING.name) == {uuids[0]: 0, uuids[1]: 1, uuids[2]: 0}
    assert by_gpu(now, N.GPU_PCIE_REPLAYS.name)[uuids[1]] == 7
    assert by_gpu(now, N.GPU_PCIE_LINK_GENERATION.name) == {uuids[0]: 5, uuids[1]: 3, uuids[2]: 4}
    assert by_gpu(now, N.GPU_PCIE_LINK_WIDTH.name)[uuids[1]] == 4
    assert by_gpu(now, N.GPU_NVLINK_ERRORS.name, error__type="crc_flit") == {uuids[0]: 0, uuids[1]: 9}
    assert by_gpu(now, N.GPU_NVLINK_ERRORS.name, error__type="replay") == {uuids[0]: 0, uuids[1]: 5}
    per_link = {(r.attributes[N.HW_ID], r.attributes[N.NVLINK_LINK], r.attributes[N.ERROR_TYPE]): r.value
                for r in select(now, N.GPU_NVLINK_LINK_ERRORS.name)}   # only the link with errors
    assert per_link == {(uuids[1], "1", "replay"): 5, (uuids[1], "1", "recovery"): 1, (uuids[1], "1", "crc_flit"): 9,
                        (uuids[1], "1", "crc_data"): 2}
    assert uuids[2] not in by_gpu(now, N.GPU_NVLINK_ERRORS.name, error__type="replay")   # no NVLink: none, not 0


def test_not_supported_is_data_and_old_gpus_report_retired_pages():
    fake = FakeNvml(gpus=[FakeGpu(arch="volta", nvlinks=0, retired_pages=(2, 1)),
                          hopper(not_supported={"nvmlDeviceGetRemappedRows", "nvmlDeviceGetPcieReplayCounter"}),
                          hopper(mig_devices=H100_MIG)], costs={})
    src = NvmlSource(nvml=fake, cadence=False)
    try:
        src.read()
        readings = src.read()
        gpus = src.describe()["gpus"]
    finally:
        src.close()
    volta, flaky, mig = (g["uuid"] for g in gpus)
    assert by_gpu(readings, N.GPU_RETIRED_PAGES.name, error__type="single_bit_ecc") == {volta: 2}
    assert by_gpu(readings, N.GPU_RETIRED_PAGES.name, error__type="double_bit_ecc") == {volta: 1}
    assert "row_remap" in gpus[0]["unsupported"] and "retired_pages" in gpus[1]["unsupported"]
    assert {"row_remap", "pcie_replay"} <= set(gpus[1]["unsupported"])
    assert flaky not in by_gpu(readings, N.GPU_PCIE_REPLAYS.name)
    assert flaky in by_gpu(readings, N.GPU_PCIE_LINK_WIDTH.name)   # the other groups still read
    assert mig in by_gpu(readings, N.GPU_ROW_REMAP_FAILED.name)    # a MIG-mode GPU answers for the whole GPU
    assert fake.calls[("nvmlDeviceGetRemappedRows", 1)] == 1       # NOT_SUPPORTED asked once
