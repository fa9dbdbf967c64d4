"""hostproc: /proc/stat's cpu line and /proc/meminfo read directly give psutil's values."""
from __future__ import annotations

import os

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.sources import hostproc
from otel_gpu.sources.host import HostSource
from fstree import write_tree

FAST = settings(max_examples=100, deadline=None)
sizes = st.integers(0, 2**50)
junk = st.one_of(st.text(max_size=300), st.lists(st.text(max_size=40), max_size=8).map("\n".join))


def meminfo_text(total, free, available, buffers, cached, reclaimable) -> str:
    rows = [("MemTotal", total), ("MemFree", free), ("MemAvailable", available), ("Buffers", buffers),
            ("Cached", cached), ("SwapCached", 7), ("Active", 1), ("SReclaimable", reclaimable)]
    return "".join(f"{k + ':':<16}{v:>8} kB\n" for k, v in rows)


@FAST
@given(st.lists(st.integers(0, 2**40), min_size=10, max_size=10), st.sampled_from([100, 250, 1000]))
def test_cpu_line_round_trip(ticks, hz):
    text = "cpu  " + " ".join(map(str, ticks)) + "\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 5\n"
    times = hostproc.parse_cpu_times(text, clk_tck=hz)
    assert times._fields == hostproc.CPU_FIELDS
    assert list(times) == [t / hz for t in ticks]


def test_cpu_line_of_an_old_kernel_is_left_to_psutil():
    assert hostproc.parse_cpu_times("cpu 1 2 3 4 5 6 7\n") is None


@FAST
@given(sizes, sizes, sizes, sizes, sizes, sizes)
def test_meminfo_round_trip_as_psutil_counts(total, free, available, buffers, cached, reclaimable):
    m = hostproc.parse_meminfo(meminfo_text(total, free, available, buffers, cached, reclaimable))
    if available == 0:   # psutil estimates it then: left to psutil
        assert m is None
        return
    assert m.total == total * 1024 and m.free == free * 1024 and m.buffers == buffers * 1024
    assert m.cached == (cached + reclaimable) * 1024   # psutil counts SReclaimable as cached
    assert m.available == (free if available > total else available) * 1024   # psutil's clamp


@FAST
@given(junk)
def test_junk_is_refused_as_the_source_expects(text):
    for parse in (hostproc.parse_cpu_times, hostproc.parse_meminfo):
        try:
            parse(text)
        except (ValueError, IndexError):
            pass   # HostSource counts these as a failed part of the read


def test_meminfo_without_memavailable_asks_psutil(tmp_path):
    class Ps:
        def virtual_memory(self):
            return "psutil's estimate"
    write_tree(tmp_path, {"stat": "cpu 1 2 3 4 5 6 7 8 9 10\n", "meminfo": "MemTotal: 10 kB\nMemFree: 5 kB\n"})
    assert hostproc.ProcHost(Ps(), str(tmp_path)).virtual_memory() == "psutil's estimate"


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="no /proc here (not Linux)")
def test_same_values_as_psutil_on_this_machine():
    ours = hostproc.ProcHost(psutil)
    vm, mine = psutil.virtual_memory(), ours.virtual_memory()
    assert mine.total == vm.total
    for field in ("available", "free", "buffers", "cached"):   # memory moves between the two reads
        assert abs(getattr(mine, field) - getattr(vm, field)) <= 0.05 * vm.total, field
    before, t, after = psutil.cpu_times(), ours.cpu_times(), psutil.cpu_times()
    assert t._fields == before._fields
    for field in t._fields:
        assert getattr(before, field) <= getattr(t, field) <= getattr(after, field), field
    assert ours.cpu_count(logical=True) == psutil.cpu_count(logical=True)   # the rest is psutil's
    assert isinstance(HostSource().ps, hostproc.ProcHost)
