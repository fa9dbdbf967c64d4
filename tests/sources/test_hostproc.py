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
    for parse in (hostproc.parse_cpu_times, hostproc.parse_meminfo, lambda t: hostproc.parse_swap(t, t)):
        try:
            parse(text)
        except (ValueError, IndexError):
            pass   # HostSource counts these as a failed part of the read


@FAST
@given(sizes, sizes, st.integers(0, 2**40), st.integers(0, 2**40), st.booleans())
def test_swap_is_psutils_swap_memory(tmp_path_factory, total, free, pswpin, pswpout, pgpgin_first):
    """Our parse of the same /proc/meminfo and /proc/vmstat texts against psutil's own function,
    pointed at them (psutil.PROCFS_PATH)."""
    root = tmp_path_factory.mktemp("proc")
    meminfo = meminfo_text(total + 7, 3, 4, 1, 2, 0) + f"SwapTotal:      {total} kB\nSwapFree:       {free} kB\n"
    vmstat = (f"nr_free_pages 5\n{'pgpgin 9' if pgpgin_first else 'pgpgout 9'}\n"
              f"pswpin {pswpin}\npswpout {pswpout}\npgfault 3\n")
    write_tree(root, {"meminfo": meminfo, "vmstat": vmstat})
    ours = hostproc.ProcHost(None, str(root)).swap_memory()
    saved = psutil.PROCFS_PATH
    psutil.PROCFS_PATH = str(root)
    try:
        theirs = psutil.swap_memory()
    finally:
        psutil.PROCFS_PATH = saved
    assert isinstance(ours, hostproc.Swap)
    assert tuple(ours) == (theirs.total, theirs.used, theirs.free, theirs.sin, theirs.sout)


@pytest.mark.parametrize("call, tree", [
    ("virtual_memory", {"meminfo": "MemTotal: 10 kB\nMemFree: 5 kB\n"}),                      # no MemAvailable
    ("swap_memory", {"meminfo": "SwapTotal: 4 kB\nSwapFree: 1 kB\n", "vmstat": "pgfault 3\n"}),   # no pswpin
    ("swap_memory", {"meminfo": "SwapTotal: 4 kB\nSwapFree: 1 kB\n"}),                              # no vmstat
])
def test_what_proc_lacks_is_asked_of_psutil(tmp_path, call, tree):
    class Ps:
        def __getattr__(self, name):
            return lambda: f"psutil's {name}"
    write_tree(tmp_path, {"stat": "cpu 1 2 3 4 5 6 7 8 9 10\n", **tree})
    assert getattr(hostproc.ProcHost(Ps(), str(tmp_path)), call)() == f"psutil's {call}"


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
    assert ours.cpu_count(logical=True) == psutil.cpu_count(logical=True)
    assert ours.cpu_count(logical=False) == psutil.cpu_count(logical=False)   # psutil's own answer
    before, load, after = psutil.getloadavg(), ours.getloadavg(), psutil.getloadavg()
    assert all(min(b, a) - 0.5 <= x <= max(b, a) + 0.5 for b, x, a in zip(before, load, after))
    swap = psutil.swap_memory()
    mine = ours.swap_memory()
    assert (mine.total, mine.sin, mine.sout) == (swap.total, swap.sin, swap.sout)   # pages swapped rarely move
    assert abs(mine.free - swap.free) <= 0.05 * max(swap.total, 1)
    assert ours.__version__ == psutil.__version__
    assert isinstance(HostSource().ps, hostproc.ProcHost)
