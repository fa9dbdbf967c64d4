"""NvmlSource against FakeNvml: flaky hardware as data."""
from __future__ import annotations

import statistics
import time

import pynvml
import pytest

from otel_gpu import names as N
from otel_gpu.readings import SourceError
from otel_gpu.sources.fake_nvml import (
    H100_MIG, FakeNvml, FakeProcess, a100, fake_cluster_node, hopper,
)
from otel_gpu.sources.nvml import NvmlSource

from .conftest import StepClock, by_gpu, select

GPM_NAMES = {s.name for s in (N.GPU_SM_ACTIVITY, N.GPU_SM_OCCUPANCY, N.GPU_TENSOR_ACTIVITY,
                              N.GPU_DRAM_ACTIVITY, N.GPU_NVLINK_RATE, N.GPU_PCIE_RATE)}


def two_reads(src, clock):
    src.read()
    clock.t += 1.0
    return src.read()


def test_hopper_has_gpm_with_sm_activity_below_utilization():
    clock = StepClock()
    src = NvmlSource(nvml=FakeNvml(gpus=[hopper()] * 8, clock=clock), clock=clock)
    first = src.read()
    assert not GPM_NAMES & {r.spec.name for r in first}        # one sample: nothing to compute yet
    clock.t += 0.5
    readings = src.read()
    sm = by_gpu(readings, N.GPU_SM_ACTIVITY.name)
    util = by_gpu(readings, N.GPU_UTILIZATION.name)
    assert len(sm) == 8
    assert all(0 < sm[g] < util[g] <= 1 for g in sm)
    assert {r.spec.name for r in readings} >= GPM_NAMES
    for r in select(readings, N.GPU_NVLINK_RATE.name) + select(readings, N.GPU_PCIE_RATE.name):
        assert 1e6 < r.value < 1e12                               # bytes/s, from MiB/s


def test_a_gpu_scripted_to_stall_with_idle_sms_reads_as_scripted():
    clock = StepClock(t=0.0)
    scripted = hopper(load=0.97, sm_share=0.25, stall=(8.0, 2.5))   # idle the last 2.5 s of every 8 s
    src = NvmlSource(nvml=FakeNvml(gpus=[scripted, hopper()], clock=clock), clock=clock)
    seen = {}
    for t in (1.0, 2.0, 6.0, 7.0, 9.0):
        clock.t = t
        readings = src.read()
        seen[t] = (by_gpu(readings, N.GPU_UTILIZATION.name), by_gpu(readings, N.GPU_SM_ACTIVITY.name))
    gpu0, gpu1 = sorted(seen[1.0][0])
    assert seen[6.0][0][gpu0] == seen[7.0][0][gpu0] == 0.02           # stalled
    assert seen[2.0][0][gpu0] > 0.85 and seen[9.0][0][gpu0] > 0.85   # busy again in the next period
    util, sm = seen[2.0]
    assert sm[gpu0] / util[gpu0] == pytest.approx(0.25, abs=0.02)     # SMs idle behind utilization
    assert sm[gpu1] / util[gpu1] == pytest.approx(0.62, abs=0.02)     # the default GPU
    assert min(seen[t][0][gpu1] for t in seen) > 0.7                   # never stalls


def test_ampere_has_no_gpm_series_at_all():
    clock = StepClock()
    src = NvmlSource(nvml=FakeNvml(gpus=[a100()] * 8, clock=clock), clock=clock)
    readings = two_reads(src, clock)
    names = {r.spec.name for r in readings}
    assert not names & GPM_NAMES
    assert N.GPU_UTILIZATION.name in names and N.GPU_NVLINK_IO.name in names
    assert all("GPM needs Hopper" in g["gpm"] for g in src.describe()["gpus"])


def test_gpm_faster_than_100ms_reuses_the_last_values():
    clock = StepClock()
    fake = FakeNvml(gpus=[hopper()], clock=clock)
    src = NvmlSource(nvml=fake, clock=clock)
    src.read()
    clock.t += 0.2
    a = by_gpu(src.read(), N.GPU_SM_ACTIVITY.name)
    samples = fake.calls[("nvmlGpmSampleGet", 0)]
    clock.t += 0.05
    b = by_gpu(src.read(), N.GPU_SM_ACTIVITY.name)
    assert a == b and fake.calls[("nvmlGpmSampleGet", 0)] == samples
    clock.t += 0.2
    src.read()
    assert fake.calls[("nvmlGpmSampleGet", 0)] == samples + 1


def test_not_supported_field_is_absent_and_probed_once():
    gpus = [hopper()] * 8
    gpus[3] = hopper(not_supported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature"})
    fake = FakeNvml(gpus=gpus)
    src = NvmlSource(nvml=fake)
    for _ in range(3):
        readings = src.read()
    energy = by_gpu(readings, N.GPU_ENERGY.name)
    uuid3 = src.describe()["gpus"][3]["uuid"]
    assert len(energy) == 7 and uuid3 not in energy
    assert uuid3 not in by_gpu(readings, N.GPU_TEMPERATURE.name)
    assert fake.calls[("nvmlDeviceGetTotalEnergyConsumption", 3)] == 1
    assert fake.calls[("nvmlDeviceGetTemperature", 3)] == 1
    assert fake.calls[("nvmlDeviceGetTotalEnergyConsumption", 2)] == 1   # costly: once in 10 s (see cadence tests)
    assert src.describe()["gpus"][3]["unsupported"]["energy"] == "Not Supported"
    assert src.partial_errors == 0


def test_gpu_lost_on_third_read_leaves_the_other_seven_reporting():
    gpus = [hopper()] * 8
    gpus[5] = hopper(lost_after_reads=2)
    fake = FakeNvml(gpus=gpus)
    src = NvmlSource(nvml=fake)
    uuids = [g["uuid"] for g in src.describe()["gpus"]]   # describe() made read 1
    src.read()                                            # read 2
    assert src.partial_errors == 0
    third = src.read()
    lost = uuids[5]
    assert by_gpu(third, N.GPU_STATUS.name, hw__state="failed")[lost] == 1
    assert by_gpu(third, N.GPU_STATUS.name, hw__state="ok")[lost] == 0
    assert {r.spec.name for r in third if r.attributes["hw.id"] == lost} == {N.GPU_STATUS.name}
    for name in (N.GPU_UTILIZATION.name, N.GPU_POWER.name, N.GPU_ENERGY.name, N.GPU_MEMORY_USAGE.name):
        assert set(by_gpu(third, name)) == set(uuids) - {lost}
    assert src.partial_errors == 1
    calls = sum(n for (fn, i), n in fake.calls.items() if i == 5)
    fourth = src.read()
    assert sum(n for (fn, i), n in fake.calls.items() if i == 5) == calls   # no longer read
    assert len(by_gpu(fourth, N.GPU_POWER.name)) == 7 and src.partial_errors == 1
    gpu5 = src.describe()["gpus"][5]
    assert gpu5["status"] == "failed: GPU is lost" and gpu5["xid_events"] == {79: 1}


def test_mig_gpu_reports_memory_per_mig_device_and_no_utilization():
    fake = FakeNvml(gpus=[hopper(mig_devices=H100_MIG), hopper()])
    src = NvmlSource(nvml=fake)
    first, second = src.read(), src.read()   # (apart: a costly field may be left out of one read)
    readings = first + second
    desc = src.describe()
    parent, plain = desc["gpus"]
    assert parent["mig_mode"] == "enabled" and plain["mig_mode"] == "disabled"
    assert [m["profile"] for m in parent["mig_devices"]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert set(by_gpu(first, N.GPU_UTILIZATION.name)) == {plain["uuid"]}
    migs = select(second, N.GPU_MEMORY_LIMIT.name, hw__parent=parent["uuid"])
    assert [r.attributes[N.MIG_PROFILE] for r in migs] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert migs[0].value == 40448 * 2**20 and migs[0].attributes["hw.id"].startswith("MIG-")
    assert parent["gpm"] == "not read in MIG mode"
    assert not select(readings, N.GPU_SM_ACTIVITY.name, hw__id=parent["uuid"])
    assert by_gpu(second, N.GPU_MEMORY_LIMIT.name)[parent["uuid"]] == 81559 * 2**20


def test_mig_devices_created_and_destroyed_while_running_are_followed():
    from otel_gpu.sources.fake_nvml import FakeMig
    from otel_gpu.sources.nvml import MIG_RESCAN_S

    clock = StepClock()
    fake = FakeNvml(gpus=[hopper(mig_devices=H100_MIG)])
    src = NvmlSource(nvml=fake, clock=clock)

    def mig_memory() -> dict[str, str]:
        """MIG device UUID -> profile, from this read's memory-limit readings."""
        return {r.attributes[N.HW_ID]: r.attributes[N.MIG_PROFILE]
                for r in select(src.read(), N.GPU_MEMORY_LIMIT.name) if N.HW_PARENT in r.attributes}

    before = mig_memory()
    kept = fake._handles[0].migs[0].uuid
    assert len(before) == 4 and before[kept] == "3g.40gb"
    fake.set_mig_devices(0, keep=1, new=(FakeMig("4g.40gb", 40448 * 2**20),))

    clock.t += 1.0   # before the next listing: the destroyed devices fall silent, nothing is made up
    assert mig_memory() == {kept: "3g.40gb"}
    clock.t += MIG_RESCAN_S
    after = mig_memory()
    (created,) = set(after) - {kept}
    assert after == {kept: "3g.40gb", created: "4g.40gb"} and created not in before
    assert [m["profile"] for m in src.describe()["gpus"][0]["mig_devices"]] == ["3g.40gb", "4g.40gb"]
    assert src.partial_errors == 0   # a destroyed MIG handle is an answer, not a failure


@pytest.mark.parametrize("error, expected", [
    (pynvml.NVMLError_DriverNotLoaded, "NVIDIA driver is not loaded"),
    (pynvml.NVMLError_LibraryNotFound, "NVIDIA driver not found (libnvidia-ml.so.1): GPU metrics are off"),
    (pynvml.NVMLError_NoPermission, "no permission"),
    (pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN), "NVML could not start (Unknown Error)"),
])
def test_init_failure_is_one_clear_line(error, expected):
    with pytest.raises(SourceError) as info:
        NvmlSource(nvml=FakeNvml(gpus=[hopper()], init_error=error))
    line = str(info.value)
    assert expected in line and "\n" not in line and line.endswith("GPU metrics are off")


def test_no_gpu_is_a_source_error_and_nvml_is_shut_down():
    fake = FakeNvml(gpus=[])
    with pytest.raises(SourceError, match="found no NVIDIA GPU"):
        NvmlSource(nvml=fake)
    assert fake.initialized == 0


def test_real_pynvml_without_driver_gives_one_line():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    with pytest.raises(SourceError) as info:
        NvmlSource()
    assert "GPU metrics are off" in str(info.value) and "\n" not in str(info.value)


def test_pcie_bytes_integrate_kb_per_second_over_elapsed_time():
    clock = StepClock()
    src = NvmlSource(nvml=FakeNvml(gpus=[hopper(pcie_kbps=(1000, 2000))]), clock=clock)
    assert by_gpu(src.read(), N.GPU_PCIE_IO.name, network__io__direction="transmit")
    clock.t += 2.0
    src.read()
    clock.t += 3.0
    readings = src.read()
    assert list(by_gpu(readings, N.GPU_PCIE_IO.name, network__io__direction="transmit").values()) == [1000 * 1024 * 5.0]
    assert list(by_gpu(readings, N.GPU_PCIE_IO.name, network__io__direction="receive").values()) == [2000 * 1024 * 5.0]


def test_pcie_throughput_is_sampled_at_most_once_a_second_at_fast_intervals():
    """NVML spends 20 ms inside each PCIe throughput call: a 100 ms agent must not call it every round
    (on GPUs without GPM; with GPM the PCIe bytes come from GPM and the call is never made)."""
    clock = StepClock()
    fake = FakeNvml(gpus=[a100(pcie_kbps=(1000, 2000))], clock=clock)
    src = NvmlSource(nvml=fake, clock=clock)
    for _ in range(30):                      # 3 s of reads every 100 ms
        readings = src.read()
        assert by_gpu(readings, N.GPU_PCIE_IO.name, network__io__direction="transmit")
        clock.t += 0.1
    calls = fake.calls[("nvmlDeviceGetPcieThroughput", 0)]
    assert 2 <= calls <= 8, calls            # 2 directions x at most one sample a second, not 2 x 30


def test_pcie_bytes_come_from_gpm_where_gpm_gives_them():
    clock = StepClock()
    fake = FakeNvml(gpus=[hopper(pcie_kbps=(1000, 2000))], clock=clock)
    src = NvmlSource(nvml=fake, clock=clock)
    for _ in range(5):
        readings = src.read()
        clock.t += 0.5
    assert fake.calls[("nvmlDeviceGetPcieThroughput", 0)] == 0
    assert list(by_gpu(readings, N.GPU_PCIE_IO.name, network__io__direction="receive").values()) == [2000 * 1024 * 2.0]


def test_clock_event_reasons_from_the_bit_mask():
    mask = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown | 0x200
    src = NvmlSource(nvml=FakeNvml(gpus=[hopper(clock_event_reasons=mask)]))
    events = {r.attributes[N.CLOCK_REASON]: r.value for r in select(src.read(), N.GPU_CLOCK_EVENT.name)}
    assert events["sw_power_cap"] == 1 and events["hw_thermal_slowdown"] == 1 and events["bit_9"] == 1
    assert events["gpu_idle"] == 0 and events["hw_slowdown"] == 0 and events["sync_boost"] == 0
    assert sum(events.values()) == 3


def test_idle_gpu_reports_gpu_idle_and_idle_clock():
    src = NvmlSource(nvml=FakeNvml(gpus=[hopper(load=0.0)]))
    readings = src.read()
    assert select(readings, N.GPU_CLOCK_EVENT.name, otelgpu__clock_event__reason="gpu_idle")[0].value == 1
    assert select(readings, N.GPU_CLOCK.name, otelgpu__clock__domain="sm")[0].value == 345e6


def test_per_process_memory_with_rank_from_proc(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_text("python\n")
    (tmp_path / "4242" / "environ").write_bytes(b"PATH=/usr/bin\0RANK=3\0LOCAL_RANK=3\0")
    (tmp_path / "4343").mkdir()
    (tmp_path / "4343" / "comm").write_text("nvtop\n")
    gpus = [hopper(processes=(FakeProcess(4242, 30 * 2**30),)), hopper(processes=(FakeProcess(4343, 2**20),))]
    src = NvmlSource(nvml=FakeNvml(gpus=gpus), proc_root=str(tmp_path))
    procs = select(src.read(), N.GPU_PROCESS_MEMORY.name)
    by_pid = {r.attributes[N.PID]: r for r in procs}
    assert by_pid["4242"].value == 30 * 2**30 and by_pid["4242"].attributes[N.RANK] == "3"
    assert by_pid["4242"].attributes[N.EXECUTABLE] == "python"
    assert N.RANK not in by_pid["4343"].attributes and by_pid["4343"].attributes[N.EXECUTABLE] == "nvtop"
    assert src.gpu_pids() == {4242, 4343}


def test_xid_events_counted_per_code_on_their_gpu():
    fake = fake_cluster_node(4)
    src = NvmlSource(nvml=fake)
    src.read()
    fake.inject_xid(2, 48)
    fake.inject_xid(2, 48)
    fake.inject_xid(1, 13)
    readings = src.read()
    uuids = [g["uuid"] for g in src.describe()["gpus"]]
    assert by_gpu(readings, N.GPU_ERRORS.name, error__type="xid_48") == {uuids[2]: 2}
    assert by_gpu(readings, N.GPU_ERRORS.name, error__type="xid_13") == {uuids[1]: 1}


def test_ecc_volatile_counts_and_nvlink_absent_without_links():
    clock = StepClock()
    fake = FakeNvml(gpus=[hopper(ecc_errors=(5, 1)), hopper(nvlinks=0)], clock=clock)
    src = NvmlSource(nvml=fake, clock=clock)
    readings = two_reads(src, clock)
    gpu0, gpu1 = (g["uuid"] for g in src.describe()["gpus"])
    assert by_gpu(readings, N.GPU_ERRORS.name, error__type="ecc_corrected")[gpu0] == 5
    assert by_gpu(readings, N.GPU_ERRORS.name, error__type="ecc_uncorrected")[gpu0] == 1
    assert set(by_gpu(readings, N.GPU_NVLINK_IO.name, network__io__direction="transmit")) == {gpu0}
    assert {r.attributes["hw.id"] for r in select(readings, N.GPU_NVLINK_RATE.name)} == {gpu0}
    assert {r.attributes["hw.id"] for r in select(readings, N.GPU_PCIE_RATE.name)} == {gpu0, gpu1}


def test_nvlink_bytes_grow_with_traffic():
    clock = StepClock()
    src = NvmlSource(nvml=FakeNvml(gpus=[hopper()], clock=clock), clock=clock)
    a = by_gpu(src.read(), N.GPU_NVLINK_IO.name, network__io__direction="receive")
    clock.t += 1.0
    b = by_gpu(src.read(), N.GPU_NVLINK_IO.name, network__io__direction="receive")
    grown = [b[g] - a[g] for g in a]
    assert all(10e9 < d < 100e9 for d in grown)    # tens of GB/s over one second


def test_close_shuts_nvml_down_once():
    fake = fake_cluster_node(2)
    src = NvmlSource(nvml=fake)
    src.read()
    src.close()
    src.close()
    assert fake.initialized == 0 and fake.calls[("nvmlShutdown", None)] == 1


def test_gpm_off_by_option():
    clock = StepClock()
    src = NvmlSource(nvml=fake_cluster_node(2, clock=clock), clock=clock, gpm=False)
    assert not GPM_NAMES & {r.spec.name for r in two_reads(src, clock)}


def test_read_of_8_fake_gpus_is_cheap():
    src = NvmlSource(nvml=fake_cluster_node(8), clock=StepClock())
    src.read()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        src.read()
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.05, f"median read {statistics.median(times) * 1e3:.1f} ms"


def test_driver_without_clock_event_reasons_falls_back_to_throttle_reasons():
    fake = FakeNvml(gpus=[hopper(load=0.0, missing_functions={"nvmlDeviceGetCurrentClocksEventReasons"})])
    src = NvmlSource(nvml=fake)
    for _ in range(3):
        readings = src.read()
    assert select(readings, N.GPU_CLOCK_EVENT.name, otelgpu__clock_event__reason="gpu_idle")[0].value == 1
    assert fake.calls[("nvmlDeviceGetCurrentClocksEventReasons", 0)] == 1
    assert fake.calls[("nvmlDeviceGetCurrentClocksThrottleReasons", 0)] == 3
    assert "clock_events" in src.describe()["gpus"][0]["supported"]


def test_transient_error_is_counted_and_retried():
    class FlakyPower(FakeNvml):
        fail = 1

        def nvmlDeviceGetPowerUsage(self, h):
            if self.fail:
                self.fail -= 1
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return super().nvmlDeviceGetPowerUsage(h)

    src = NvmlSource(nvml=FlakyPower(gpus=[hopper()]))
    assert not select(src.read(), N.GPU_POWER.name) and src.partial_errors == 1
    assert src.describe()["gpus"][0]["errors"] == {"power": "Timeout"}
    assert select(src.read(), N.GPU_POWER.name) and src.partial_errors == 1


def test_a_gpm_metric_that_stops_answering_leaves_the_readings_and_the_rest_stay_right():
    """The GPM readings are built by a plan worked out once for the metrics a GPU gives; a metric
    NVML stops giving (NOT_SUPPORTED) leaves, and every other reading keeps its own value."""
    class TensorGoes(FakeNvml):
        gone = False

        def nvmlGpmMetricsGet(self, req):
            req = super().nvmlGpmMetricsGet(req)
            if self.gone:
                for k in range(req.numMetrics):
                    if req.metrics[k].metricId == pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL:
                        req.metrics[k].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return req

    clock = StepClock()
    fake = TensorGoes(gpus=[hopper()], clock=clock, costs={})
    src = NvmlSource(nvml=fake, clock=clock)
    before = two_reads(src, clock)
    fake.gone = True
    clock.t += 1.0
    after = src.read()
    names = {r.spec.name for r in after}
    assert N.GPU_TENSOR_ACTIVITY.name in {r.spec.name for r in before} and N.GPU_TENSOR_ACTIVITY.name not in names
    sm = by_gpu(after, N.GPU_SM_ACTIVITY.name)
    util = by_gpu(after, N.GPU_UTILIZATION.name)
    assert list(sm.values()) == [pytest.approx(list(util.values())[0] * 0.62, abs=0.011)]   # sm_share 0.62
    rates = {r.attributes[N.DIRECTION]: r.value for r in select(after, N.GPU_PCIE_RATE.name)}
    assert rates["receive"] > rates["transmit"] > 0
