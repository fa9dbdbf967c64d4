"""A negative or non-numeric counter in a /proc tree is malformed: the parsers leave its row (or
field) out and say so, the source counts a read error, and the value is never exported."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_gpu.sources import disk, host, net, process
from otel_gpu.sources.procfields import counter
from tests.servers import free_port, wait_until

from tests.sources.fstree import write_tree

GOOD = st.integers(0, 2**64 - 1).map(str)
BAD = st.one_of(st.integers(-2**63, -1).map(str), st.sampled_from(["abc", "1.5", "+3", "1e3", "0x10", "--1", "-0"]))
FIELD = st.one_of(GOOD, BAD)
IFACE = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)


def _ok(text: str) -> bool:
    return text.isdigit() and text.isascii()


@given(st.text(max_size=30))
def test_counter_takes_only_plain_non_negative_integers(text):
    try:
        value = counter(text)
    except ValueError:
        assert not _ok(text.strip())
        return
    assert _ok(text.strip()) and value == int(text.strip()) and value >= 0


@given(st.dictionaries(IFACE, st.lists(FIELD, min_size=16, max_size=16), max_size=6))
def test_net_dev_leaves_out_malformed_rows(table):
    text = "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n" + "\n".join(
        f"{name.rjust(6)}: " + " ".join(values) for name, values in table.items())
    bad: list[str] = []
    parsed = net.parse_net_dev(text, bad)
    good = {n for n, values in table.items() if all(_ok(v) for v in values)}
    assert set(parsed) == good
    assert sorted(b.split(":")[0] for b in bad) == sorted(set(table) - good)
    assert all(v >= 0 for row in parsed.values() for v in row.values())


@given(st.dictionaries(IFACE, st.lists(FIELD, min_size=11, max_size=17), max_size=6))
def test_diskstats_leaves_out_malformed_lines(table):
    text = "\n".join(f"   8  0 {name} " + " ".join(values) for name, values in table.items())
    bad: list[str] = []
    parsed = disk.parse_diskstats(text, bad)
    good = {n for n, values in table.items() if all(_ok(v) for v in values[:11])}
    assert {d.name for d in parsed} == good
    assert len(bad) == len(table) - len(good)
    assert all(getattr(d, f) >= 0 for d in parsed for f in ("reads", "read_sectors", "read_ms", "writes",
                                                            "write_sectors", "write_ms", "io_ms"))


@given(st.dictionaries(st.sampled_from(["rchar", "wchar", "read_bytes", "write_bytes", "syscr"]), FIELD))
def test_proc_io_leaves_out_malformed_fields(fields):
    bad: list[str] = []
    parsed = process.parse_io("\n".join(f"{k}: {v}" for k, v in fields.items()), bad)
    assert parsed == {k: int(v) for k, v in fields.items() if _ok(v)}
    assert len(bad) == sum(not _ok(v) for v in fields.values())


@given(utime=FIELD, rss=FIELD)
def test_proc_stat_refuses_a_malformed_time_or_size(utime, rss):
    fields = ["S"] + ["1"] * 10 + [utime, "2"] + ["0"] * 6 + ["77", "0", rss] + ["0"] * 20
    text = "123 (my (odd) name) " + " ".join(fields)
    if _ok(utime) and _ok(rss):
        st_ = process.parse_stat(text, clk_tck=100, page_size=4096)
        assert st_.cpu_s == (int(utime) + 2) / 100 and st_.rss_bytes == int(rss) * 4096
    else:
        with pytest.raises(ValueError):
            process.parse_stat(text)


@given(free=st.integers(-10**12, 10**12), sin=st.integers(-10**6, 10**6), load=st.floats(-5, 5))
def test_host_exports_no_negative_memory_swap_or_load(free, sin, load):
    vm = SimpleNamespace(total=16 * 2**30, available=8 * 2**30, free=free, buffers=0, cached=0)
    sw = SimpleNamespace(total=2**30, used=0, free=2**30, sin=sin, sout=0)
    times = SimpleNamespace(user=1.0, nice=0.0, system=1.0, idle=10.0, iowait=0.0, irq=0.0, softirq=0.0, steal=0.0)
    ps = SimpleNamespace(cpu_times=lambda: times, cpu_count=lambda logical: 2, virtual_memory=lambda: vm,
                         swap_memory=lambda: sw, getloadavg=lambda: (load, 0.0, 0.0))
    src = host.HostSource(psutil_module=ps)
    readings = src.read()
    assert all(r.value >= 0 for r in readings), [r for r in readings if r.value < 0]
    expected_errors = (free < 0) + (sin < 0) + (load < 0)
    assert src.partial_errors == expected_errors
    assert any(r.spec.name == "system.memory.usage" for r in readings) == (free >= 0)


NET_DEV = ("Inter-|   Receive                                                |  Transmit\n"
           " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
           "carrier compressed\n"
           "  eth0: -1 2 0 0 0 0 0 0 5 6 0 0 0 0 0 0\n"
           "  eth1: 100 2 0 0 0 0 0 0 5 6 0 0 0 0 0 0\n")
DISKSTATS = ("   8       0 sda 10 0 -1 4 5 0 7 8 0 9 10\n"
             "   8      16 sdb 10 0 30 4 5 0 70 8 0 9 10\n")


@pytest.fixture
def tree(tmp_path) -> Path:
    return write_tree(tmp_path, {"proc/net/dev": NET_DEV, "proc/diskstats": DISKSTATS, "proc/1/stat": "",
                                 "sys/class/net/.keep": ""})


def test_sources_count_the_malformed_rows(tree):
    n = net.NetSource(sys_root=str(tree / "sys"), proc_root=str(tree / "proc"), exclude=())
    readings = n.read()
    assert {r.attributes["network.interface.name"] for r in readings} == {"eth1"}
    assert n.partial_errors == 1
    assert any("eth0" in u and "'-1'" in u for u in n.describe()["unreadable"])
    d = disk.DiskSource(proc_root=str(tree / "proc"), sys_root=str(tree / "sys"), all_devices=True)
    readings = d.read()
    assert {r.attributes["system.device"] for r in readings} == {"sdb"}
    assert d.partial_errors == 1
    d.read()
    assert d.partial_errors == 2   # counted on every read that meets it


def test_the_agent_exports_no_negative_counter_and_counts_the_error(tree):
    port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "otel_gpu", "agent", "--no-live", "--no-gpu", "--interval", "0.5",
                              "--proc-root", str(tree / "proc"), "--sys-root", str(tree / "sys"),
                              "--prometheus-port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def scraped():
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                return None
            return text if "otelgpu_agent_source_errors_total" in text and "system_network_io" in text else None

        text = wait_until(scraped, 60, "the agent's scrape endpoint")
    finally:
        agent.terminate()
        agent.wait(timeout=20)
    samples = [line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")]
    io = [(k, float(v)) for k, v in samples if k.startswith(("system_network_io", "system_disk_io"))]
    assert io and all(v >= 0 for _, v in io), io
    assert not [k for k, _ in io if 'eth0' in k or '"sda"' in k]
    errors = {k: float(v) for k, v in samples if k.startswith("otelgpu_agent_source_errors_total")}
    assert any('source="net"' in k and v >= 1 for k, v in errors.items()), errors
    assert any('source="disk"' in k and v >= 1 for k, v in errors.items()), errors


def test_once_json_has_no_negative_counter(tree):
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "agent", "--once", "--json", "--no-gpu",
                          "--proc-root", str(tree / "proc"), "--sys-root", str(tree / "sys")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [r for r in json.loads(out.stdout) if r["name"].startswith(("system.network", "system.disk"))]
    assert rows and all(r["value"] >= 0 for r in rows)
    assert {r["attributes"].get("network.interface.name") for r in rows if r["name"] == "system.network.io"} == {"eth1"}
