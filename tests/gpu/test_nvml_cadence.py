"""Costly NVML calls: measured, read apart from the sampling round, same values as reading everything."""
from __future__ import annotations

import math
import statistics
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu import names as N
from otel_gpu.agent.sampler import Sampler
from otel_gpu.agent.store import Store, attrs_key
from otel_gpu.sources.fake_nvml import H100_COSTS, FakeCost, FakeNvml, a100, hopper
from otel_gpu.sources.gpm import sample_spacing
from otel_gpu.sources.nvml import NvmlSource
from otel_gpu.sources.nvml_cadence import BUDGET_CPU, CallCost, is_costly, median, stretch

from .conftest import StepClock, by_gpu

COUNTERS = (N.GPU_ENERGY.name, N.GPU_PCIE_IO.name)


def series(readings) -> dict:
    return {(r.spec.name, attrs_key(r.attributes)): r.value for r in readings}


def test_fake_calls_cost_what_they_cost_on_an_h100():
    fake = FakeNvml(gpus=[hopper()])
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    t0, c0 = time.perf_counter(), time.thread_time()
    fake.nvmlDeviceGetTotalEnergyConsumption(h)
    assert time.thread_time() - c0 >= 0.9 * H100_COSTS["nvmlDeviceGetTotalEnergyConsumption"].cpu_s
    t0, c0 = time.perf_counter(), time.thread_time()
    fake.nvmlDeviceGetPcieThroughput(h, fake.NVML_PCIE_UTIL_TX_BYTES)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    assert wall >= 0.02 and cpu < 0.01                   # it sleeps inside the call
    free = FakeNvml(gpus=[hopper()], costs={})
    free.nvmlInit()
    t0 = time.perf_counter()
    free.nvmlDeviceGetPcieThroughput(free.nvmlDeviceGetHandleByIndex(0), free.NVML_PCIE_UTIL_TX_BYTES)
    assert time.perf_counter() - t0 < 0.005


def test_costly_is_measured_not_named():
    assert is_costly(wall_s=0.021, cpu_s=0.0008) and is_costly(wall_s=0.004, cpu_s=0.004)
    assert not is_costly(wall_s=1e-5, cpu_s=1e-5)
    assert stretch(0.4e-3) == 1.0 and stretch(8 * 4e-3 / 10) == pytest.approx(8 * 4e-3 / 10 / BUDGET_CPU)
    c = CallCost("f")
    for w in (0.001, 0.003, 0.002):
        c.add(w, w / 2)
    assert c.known and c.wall_s == 0.0025 and c.cpu_s == 0.00125   # the calls after the first
    assert c.first_wall_s == 0.001 and c.first_cpu_s == 0.0005


def test_slow_path_and_cadence_read_the_same_values():
    """Two identical fakes on one clock: every field every read against the cadence. Gauges agree
    exactly; the energy counter is the exact value as of its last read; PCIe bytes (GPM against
    throughput samples) agree."""
    clock = StepClock(t=0.0)
    gpus = [hopper(pcie_kbps=(3000, 7000)), hopper(pcie_kbps=(100, 200), load=0.3)]
    costs = {"nvmlDeviceGetTotalEnergyConsumption": H100_COSTS["nvmlDeviceGetTotalEnergyConsumption"]}
    slow = NvmlSource(nvml=FakeNvml(gpus=gpus, clock=clock, costs=costs), clock=clock, cadence=False)
    fast = NvmlSource(nvml=FakeNvml(gpus=gpus, clock=clock, costs=costs), clock=clock)
    energy_at: dict[float, dict] = {}
    for step in range(25):
        clock.t = float(step)
        a, b = series(slow.read()), series(fast.read())
        assert a.keys() == b.keys()
        for key, value in a.items():
            if key[0] not in COUNTERS:
                assert b[key] == value, key
        energy_at[clock.t] = by_gpu(slow.read(), N.GPU_ENERGY.name)
        got = {k: v for k, v in b.items() if k[0] == N.GPU_ENERGY.name}
        last_read = fast.devices[0].costly["energy"].read_at   # every 16 s or so (2 GPUs, 0.5 ms/s budget)
        assert sorted(got.values()) == sorted(energy_at[last_read].values())
        for key, value in a.items():
            if key[0] == N.GPU_PCIE_IO.name:
                assert b[key] == pytest.approx(value, rel=1e-9), key
    assert 0.0 < last_read < 24.0   # read again after the first read: exact then, not extrapolated


def test_energy_period_stretches_with_the_gpu_count_to_stay_in_budget():
    clock = StepClock(t=0.0)
    one = NvmlSource(nvml=FakeNvml(gpus=[hopper()], clock=clock), clock=clock)
    eight = NvmlSource(nvml=FakeNvml(gpus=[hopper()] * 8, clock=clock), clock=clock)
    one.read(), eight.read()
    assert one.devices[0].costly["energy"].period_s == 10.0
    period = eight.devices[0].costly["energy"].period_s
    assert 40 <= period <= 120, period     # 8 x ~4 ms every 10 s would be 3.2 ms/s: stretched to <= 0.5 ms/s
    calls = eight._nvml.calls
    for t in range(1, 200):
        clock.t = float(t)
        eight.read()
    n = calls[("nvmlDeviceGetTotalEnergyConsumption", 0)]
    assert 200 / period - 1 <= n <= 200 / period + 2, (n, period)


def test_cheap_energy_counter_is_read_every_round():
    clock = StepClock(t=0.0)
    fake = FakeNvml(gpus=[hopper()], clock=clock, costs={})
    src = NvmlSource(nvml=fake, clock=clock)
    for t in range(40):
        clock.t = float(t)
        src.read()
    before = fake.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)]
    for t in range(40, 45):
        clock.t = float(t)
        src.read()
    assert fake.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)] == before + 5
    assert "energy" not in src.devices[0].costly


class TimedSource:
    """Wraps a source: the wall time of each read, for the test's eyes only."""

    def __init__(self, src):
        self.src, self.name, self.times = src, src.name, []

    @property
    def partial_errors(self):
        return self.src.partial_errors

    def read(self):
        t0 = time.perf_counter()
        try:
            return self.src.read()
        finally:
            self.times.append(time.perf_counter() - t0)


def test_a_20ms_call_does_not_delay_the_100ms_sampling_loop():
    """8 GPUs without GPM: 16 PCIe throughput samples of ~21 ms and 8 energy reads of ~4 ms each
    pass in the background; the 100 ms rounds stay short and on time, and the PCIe bytes are
    integrated between the times the samples were actually taken."""
    calls: list[tuple[int, float]] = []
    lock = threading.Lock()

    class Logged(FakeNvml):
        def nvmlDeviceGetPcieThroughput(self, h, counter):
            t = self.clock()
            value = super().nvmlDeviceGetPcieThroughput(h, counter)
            if counter == self.NVML_PCIE_UTIL_TX_BYTES:
                with lock:
                    calls.append((h.index, t))
            return value

    fake = Logged(gpus=[a100(pcie_kbps=(5000, 9000))] * 8, costs={**H100_COSTS,
                  "nvmlDeviceGetPcieThroughput": FakeCost(cpu_s=0.8e-3, sleep_s=20e-3)})
    src = NvmlSource(nvml=fake, background=True, budget_cpu=1.0)   # no stretching: PCIe every second
    timed_src = TimedSource(src)
    store = Store(window_s=10.0)
    sampler = Sampler([timed_src], store, interval_s=0.1)
    sampler.start()
    time.sleep(2.5)
    sampler.stop()
    src.close()
    assert len(timed_src.times) >= 18
    assert statistics.median(timed_src.times) < 0.01, timed_src.times   # no 21 ms call in the round
    assert sampler.overruns <= 1
    key = attrs_key(src.devices[0].tagged(N.GPU_TASK, "general"))
    times = list(store._series[N.GPU_UTILIZATION.name][key].times)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.median(gaps) == pytest.approx(0.1, abs=0.01)            # readings stamped on the tick
    for dev in src.devices:
        mine = [t for i, t in calls if i == dev.index]
        assert len(mine) >= 2
        expected = 5000 * 1024 * (mine[-1] - mine[0])
        assert dev.pcie_bytes["transmit"] == pytest.approx(expected, rel=0.02, abs=5000 * 1024 * 0.002)
    energy = by_gpu([r for r in src.read()], N.GPU_ENERGY.name)
    assert len(energy) == 8


def test_a_gpu_lost_in_a_background_read_is_marked_failed_by_the_round():
    gpus = [hopper()] * 3
    gpus[1] = hopper(lost_after_reads=0)
    src = NvmlSource(nvml=FakeNvml(gpus=gpus, costs={}), background=True)
    try:
        for _ in range(20):
            readings = src.read()
            if src.devices[1].failed:
                break
            time.sleep(0.02)
        readings = src.read()
    finally:
        src.close()
    assert src.devices[1].failed == "GPU is lost"
    assert len(by_gpu(readings, N.GPU_POWER.name)) == 2


def test_doctor_lists_each_field_with_its_cost_and_cadence():
    src = NvmlSource(nvml=FakeNvml(gpus=[hopper()] * 2), background=True)
    try:
        src.time_calls()   # as doctor does: calls after the first, for per-call costs
        rows = {r["field"]: r for r in src.describe()["field_costs"]}
    finally:
        src.close()
    assert rows["energy"]["cpu_ms"] >= 3.5 and "background" in rows["energy"]["read"]
    assert rows["pcie_transmit"]["wall_ms"] >= 20 and "GPM" in rows["pcie_transmit"]["read"]
    assert rows["utilization"]["cpu_ms"] < 0.5 and rows["utilization"]["read"] == "every sample"
    assert rows["power_limit"]["read"] == "every 10 s (rarely changes)"


@settings(max_examples=200, deadline=None)
@given(st.floats(0.1, 3600))
def test_gpm_sample_spacing_is_more_than_100ms_and_a_whole_number_of_reads(interval_s):
    spacing = sample_spacing(interval_s)
    assert spacing >= 0.1
    k = math.floor(spacing / interval_s) + 1          # the read that samples next, counting from the last
    assert k * interval_s > 0.1 * 1.05                # > 100 ms apart, with room for jitter
    assert spacing <= (k - 0.5) * interval_s + 1e-12 or spacing == 0.1   # half a read of slack
    if interval_s >= 0.11:
        assert k == 1                                 # every read


def test_at_100ms_gpm_samples_every_other_read_and_its_values_stay_exact():
    """Reads every 0.1 s (with jitter): GPM samples at every other read (0.2 s apart, never closer
    than 100 ms), repeats its last readings in between, and the PCIe byte counters integrate its
    rates over every interval: no traffic is lost."""
    clock = StepClock()
    fake = FakeNvml(gpus=[hopper(pcie_kbps=(5000, 9000))] * 2, clock=clock, costs={})
    src = NvmlSource(nvml=fake, clock=clock, interval_s=0.1)
    start = clock.t
    src.read()
    jitter = [0.003, -0.002, 0.0, 0.004, -0.003]
    gpm_rounds = []
    for i in range(1, 41):
        clock.t = start + 0.1 * i + jitter[i % len(jitter)]
        before = fake.calls[("nvmlGpmSampleGet", 0)]
        readings = src.read()
        if fake.calls[("nvmlGpmSampleGet", 0)] > before:
            gpm_rounds.append(i)
        if i >= 2:   # from the second sample on, in every read
            assert len(by_gpu(readings, N.GPU_SM_ACTIVITY.name)) == 2
    src.close()
    assert gpm_rounds == list(range(2, 41, 2))
    dev = src.devices[0]
    elapsed = clock.t - start   # from the first sample to the last (read 40 sampled)
    assert dev.pcie_bytes["transmit"] == pytest.approx(5000 * 1024 * elapsed, rel=0.01)


def test_doctor_says_how_often_gpm_is_sampled_at_the_agents_interval():
    for interval_s, expected in ((0.1, "every 2 samples (0.2 s"), (1.0, "every sample")):
        src = NvmlSource(nvml=FakeNvml(gpus=[hopper()], costs={}), interval_s=interval_s)
        try:
            rows = {r["field"]: r for r in src.describe()["field_costs"]}
        finally:
            src.close()
        assert rows["gpm"]["read"].startswith(expected), rows["gpm"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=10, allow_nan=False), min_size=1, max_size=30))
def test_median_is_statistics_median(values):
    """The cost medians are `statistics.median`'s, bit for bit (its import is kept out of the agent)."""
    assert median(values) == statistics.median(values)
