"""Pure helpers of the GPU sources and the fake's own contract."""
from __future__ import annotations

import pynvml
import pytest

from otel_gpu import names as N
from otel_gpu.sources import nvml_errors as E
from otel_gpu.sources.fake_nvml import FakeNvml, fake_cluster_node, hopper
from otel_gpu.sources.gpm import gpm_readings
from otel_gpu.sources.nvml import clock_reason_values, mig_profile


def test_clock_reason_values_names_every_known_bit():
    v = clock_reason_values(0x4 | 0x80)
    assert v["sw_power_cap"] == 1 and v["hw_power_brake"] == 1 and v["gpu_idle"] == 0
    assert clock_reason_values(0) == {k: 0 for k in v}
    assert clock_reason_values(1 << 12)["bit_12"] == 1


def test_mig_profile_from_device_name():
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "1g.10gb"
    assert mig_profile("NVIDIA A100-SXM4-80GB MIG 3g.40gb") == "3g.40gb"
    assert mig_profile("NVIDIA H100 80GB HBM3") is None


def test_gpm_readings_convert_percent_and_mib_per_second():
    out = gpm_readings({"NVML_GPM_METRIC_SM_UTIL": 42.0, "NVML_GPM_METRIC_DRAM_BW_UTIL": 100.7,
                        "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": 2.0,
                        "NVML_GPM_METRIC_PCIE_RX_PER_SEC": 1.5}, {"hw.id": "GPU-x"})
    got = {(r.spec.name, r.attributes.get(N.DIRECTION)): r.value for r in out}
    assert got[(N.GPU_SM_ACTIVITY.name, None)] == pytest.approx(0.42)
    assert got[(N.GPU_DRAM_ACTIVITY.name, None)] == 1.0                 # clamped
    assert got[(N.GPU_NVLINK_RATE.name, "transmit")] == 2 * 1024 * 1024
    assert got[(N.GPU_PCIE_RATE.name, "receive")] == 1.5 * 1024 * 1024
    no_links = gpm_readings({"NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": 2.0}, {}, nvlink=False)
    assert no_links == []


def test_error_classes():
    assert E.classify(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)) == E.UNSUPPORTED
    assert E.classify(pynvml.NVMLError_GpuIsLost()) == E.LOST
    assert E.classify(pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)) == E.TRANSIENT
    assert E.describe_error(pynvml.NVMLError(28)) == "GpuNotFound"
    assert E.init_error_line(pynvml.NVMLError_LibraryNotFound()) == \
        "NVIDIA driver not found (libnvidia-ml.so.1): GPU metrics are off"


def test_fake_raises_the_real_pynvml_classes():
    fake = FakeNvml(gpus=[hopper(not_supported={"nvmlDeviceGetPowerUsage"})])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetPowerUsage(h)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.NVML_CLOCK_SM == pynvml.NVML_CLOCK_SM
    with pytest.raises(AttributeError):
        fake.nvmlDeviceGetSomethingMadeUp


def test_fake_values_vary_and_stay_plausible():
    t = [0.0]
    fake = fake_cluster_node(8, clock=lambda: t[0])
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    utils = set()
    for step in range(20):
        t[0] = step * 0.4
        utils.add(fake.nvmlDeviceGetUtilizationRates(h).gpu)
        assert 69_000 <= fake.nvmlDeviceGetPowerUsage(h) <= 700_000
    assert len(utils) > 3 and all(70 <= u <= 100 for u in utils)


def test_fake_cluster_node_rejects_unknown_arch():
    with pytest.raises(ValueError, match="unknown fake GPU architecture"):
        fake_cluster_node(2, "kepler")
