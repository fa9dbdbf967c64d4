import os
import time
from collections import namedtuple

import psutil
import pytest

from otel_gpu import names
from otel_gpu.readings import SourceError
from otel_gpu.sources.host import HostSource, cpu_fractions, memory_states, memory_utilization
from fstree import one, values

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
VMem = namedtuple("VMem", "total available percent used free buffers cached")
Swap = namedtuple("Swap", "total used free percent sin sout")


class FakePsutil:
    """The five psutil calls the host source makes, with scripted answers."""

    __version__ = "fake"

    def __init__(self, times, fail=()):
        self.times = list(times)
        self.fail = set(fail)
        self.calls = {}

    def _check(self, what):
        self.calls[what] = self.calls.get(what, 0) + 1
        if what in self.fail:
            raise OSError(2, f"{what} unavailable")

    def cpu_times(self):
        self._check("cpu_times")
        return self.times.pop(0)

    def cpu_count(self, logical=True):
        self._check("cpu_count")
        return 8

    def virtual_memory(self):
        self._check("virtual_memory")
        return VMem(total=1000, available=700, percent=30.0, used=300, free=500, buffers=50, cached=150)

    def swap_memory(self):
        self._check("swap_memory")
        return Swap(total=400, used=100, free=300, percent=25.0, sin=3 * 4096, sout=5 * 4096)

    def getloadavg(self):
        self._check("getloadavg")
        return (1.5, 1.0, 0.5)


def ct(user=0.0, system=0.0, idle=0.0, iowait=0.0, steal=0.0):
    return CpuTimes(user, 0.0, system, idle, iowait, 0.0, 0.0, steal, 0.0, 0.0)


def test_cpu_fractions():
    f = cpu_fractions({"user": 1, "idle": 1, "iowait": 5}, {"user": 2, "idle": 4, "iowait": 4})
    assert f == {"user": 0.25, "idle": 0.75, "iowait": 0.0}  # iowait went backwards: 0
    assert cpu_fractions({"user": 1}, {"user": 1}) is None


def test_memory_states_sum_to_total():
    vm = VMem(total=1000, available=700, percent=30.0, used=300, free=500, buffers=50, cached=150)
    assert memory_states(vm) == {"free": 500, "buffers": 50, "cached": 150, "used": 300}
    assert sum(memory_states(vm).values()) == vm.total
    assert memory_utilization(vm) == 0.3


def test_reads_fake():
    ps = FakePsutil([ct(user=10, idle=10), ct(user=13, system=1, idle=15, iowait=1)])
    src = HostSource(ps)
    first = src.read()
    assert not values(first, names.CPU_UTILIZATION)  # no earlier sample yet
    out = src.read()
    cpu = {dict(k)[names.CPU_MODE]: v for k, v in values(out, names.CPU_UTILIZATION).items()}
    assert cpu["user"] == pytest.approx(0.3) and cpu["idle"] == pytest.approx(0.5)
    assert cpu["system"] == pytest.approx(0.1) and cpu["iowait"] == pytest.approx(0.1)
    assert set(cpu) == {"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"}
    assert sum(cpu.values()) == pytest.approx(1.0)
    assert one(out, names.CPU_COUNT) == 8
    assert one(out, names.MEMORY_LIMIT) == 1000
    assert one(out, names.MEMORY_USAGE, **{names.MEMORY_STATE: "used"}) == 300
    assert one(out, names.MEMORY_UTILIZATION) == pytest.approx(0.3)
    assert one(out, names.PAGING_USAGE, **{names.PAGING_STATE: "free"}) == 300
    assert one(out, names.PAGING_OPERATIONS, **{names.PAGING_OPERATIONS.attributes[0]: "out"}) == 5
    assert one(out, names.LOAD_1M) == 1.5
    assert src.partial_errors == 0


def test_same_tick_keeps_base():
    ps = FakePsutil([ct(user=10, idle=10), ct(user=10, idle=10), ct(user=11, idle=11)])
    src = HostSource(ps)
    src.read()
    assert not values(src.read(), names.CPU_UTILIZATION)
    assert one(src.read(), names.CPU_UTILIZATION, **{names.CPU_MODE: "user"}) == 0.5


def test_partial_and_total_failure():
    src = HostSource(FakePsutil([ct(user=1)], fail={"swap_memory"}))
    out = src.read()
    assert values(out, names.MEMORY_LIMIT) and not values(out, names.PAGING_USAGE)
    assert src.partial_errors == 1
    assert src.describe()["unreadable"] == ["swap_memory: FileNotFoundError: [Errno 2] swap_memory unavailable"]
    dead = HostSource(FakePsutil([], fail={"cpu_times", "cpu_count", "virtual_memory", "swap_memory", "getloadavg"}))
    with pytest.raises(SourceError, match="every psutil call failed"):
        dead.read()


def test_real_machine_does_not_block():
    src = HostSource()
    start = time.perf_counter()
    src.read()
    first = time.perf_counter() - start
    assert first < 0.05  # the first read does not sleep to measure CPU
    time.sleep(0.05)
    mid = time.perf_counter()
    out = src.read()
    elapsed = time.perf_counter() - mid
    modes = {r.attributes[names.CPU_MODE] for r in out if r.spec is names.CPU_UTILIZATION}
    assert "user" in modes and "idle" in modes
    assert all(0 <= r.value <= 1 for r in out if r.spec is names.CPU_UTILIZATION)
    assert one(out, names.CPU_COUNT) == os.cpu_count()
    assert one(out, names.MEMORY_LIMIT) == psutil.virtual_memory().total > 0
    assert 0 < one(out, names.MEMORY_UTILIZATION) < 1
    assert one(out, names.LOAD_1M) >= 0
    print(f"host read: {elapsed * 1e3:.2f} ms, {len(out)} readings")
    assert elapsed < 0.020


def test_swap_and_cpu_count_are_read_every_10_s_and_repeated_in_between():
    ps, t = FakePsutil([ct(user=i, idle=i) for i in range(1, 5)]), [0.0]
    src = HostSource(ps, clock=lambda: t[0])
    for t[0] in (0.0, 1.0, 9.9, 10.0):
        out = src.read()
        assert one(out, names.PAGING_USAGE, **{names.PAGING_STATE: "used"}) == 100
        assert one(out, names.CPU_COUNT) == 8
    assert ps.calls["swap_memory"] == ps.calls["cpu_count"] == 2   # at 0 s and 10 s
    assert ps.calls["virtual_memory"] == ps.calls["cpu_times"] == 4
