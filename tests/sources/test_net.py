import errno
import os
import time

import pytest

from otel_gpu import names
from otel_gpu.readings import Source, SourceError
from otel_gpu.sources.net import CounterState, NetSource, parse_net_dev, selected, speed_bytes_per_second
from fstree import one, values, write_tree

HEADER = ("Inter-|   Receive                                                |  Transmit\n"
          " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n")


def dev_line(iface, rx_bytes, tx_bytes, rx_packets=1, tx_packets=2, rx_errs=3, tx_errs=4, rx_drop=5, tx_drop=6):
    rx = [rx_bytes, rx_packets, rx_errs, rx_drop, 0, 0, 0, 0]
    tx = [tx_bytes, tx_packets, tx_errs, tx_drop, 0, 0, 0, 0]
    return f"{iface:>6}: " + " ".join(str(v) for v in rx + tx) + "\n"


def tree(tmp_path, lines, speeds=None):
    files = {"proc/net/dev": HEADER + "".join(lines)}
    for iface, speed in (speeds or {}).items():
        files[f"sys/class/net/{iface}/speed"] = f"{speed}\n"
    write_tree(tmp_path, files)
    return str(tmp_path / "sys"), str(tmp_path / "proc")


def test_parse_net_dev():
    parsed = parse_net_dev(HEADER + dev_line("lo", 10, 10) + "  eth0:311518660 6427 0 0 0 0 0 0 437252 4234 1 2 0 0 0 0\n")
    assert set(parsed) == {"lo", "eth0"}
    assert parsed["eth0"]["rx_bytes"] == 311518660 and parsed["eth0"]["tx_bytes"] == 437252
    assert parsed["eth0"]["rx_packets"] == 6427 and parsed["eth0"]["tx_errs"] == 1 and parsed["eth0"]["tx_drop"] == 2


def test_speed_parse():
    assert speed_bytes_per_second("25000\n") == 25e9 / 8
    assert speed_bytes_per_second("-1\n") is None
    assert speed_bytes_per_second("0") is None
    assert speed_bytes_per_second("") is None


def test_selected_globs():
    assert not selected("lo", None, ("lo",))
    assert selected("eth0", None, ("lo",))
    assert selected("ib0", ("ib*", "eth0"), ())
    assert not selected("docker0", ("ib*", "eth0"), ())
    assert not selected("veth12", None, ("lo", "veth*"))


def test_counter_state_wrap_and_reset():
    c = CounterState()
    assert c.update("k", 100) == (100, "ok")
    assert c.update("k", 150) == (150, "ok")
    assert c.update("k", 10, modulus=2**32) == (150 + (10 - 150) % 2**32, "wrap")
    c2 = CounterState()
    c2.update("k", 2**40)
    assert c2.update("k", 7, modulus=2**32) == (2**40 + 7, "reset")  # too big to be a 32-bit wrap
    assert c2.update("k", 9) == (2**40 + 9, "ok")


def test_reads_fixture(tmp_path):
    sys_root, proc_root = tree(tmp_path, [dev_line("lo", 1, 1), dev_line("eth0", 1000, 2000), dev_line("ib0", 5, 6)],
                               speeds={"eth0": 25000, "ib0": -1})
    src = NetSource(sys_root, proc_root)
    assert isinstance(src, Source)
    out = src.read()
    assert not values(out, names.NET_IO, **{names.IFACE: "lo"})
    assert one(out, names.NET_IO, **{names.IFACE: "eth0", names.DIRECTION: "receive"}) == 1000
    assert one(out, names.NET_IO, **{names.IFACE: "eth0", names.DIRECTION: "transmit"}) == 2000
    assert one(out, names.NET_PACKETS, **{names.IFACE: "eth0", names.DIRECTION: "transmit"}) == 2
    assert one(out, names.NET_ERRORS, **{names.IFACE: "eth0", names.DIRECTION: "receive"}) == 3
    assert one(out, names.NET_DROPPED, **{names.IFACE: "eth0", names.DIRECTION: "transmit"}) == 6
    limits = values(out, names.NET_LIMIT)
    assert limits == {(("hw.id", "eth0"), ("hw.type", "network"), ("network.interface.name", "eth0")): 25e9 / 8}
    assert src.partial_errors == 0
    d = src.describe()
    assert [i["name"] for i in d["interfaces"]] == ["eth0", "ib0"]
    assert d["interfaces"][0]["speed_bps"] == 25e9
    assert any("ib0/speed: -1" in u for u in d["unreadable"])


def test_counter_going_backwards_stays_monotonic(tmp_path):
    sys_root, proc_root = tree(tmp_path, [dev_line("eth0", 1000, 2000)])
    src = NetSource(sys_root, proc_root)
    src.read()
    tree(tmp_path, [dev_line("eth0", 1500, 2500)])
    assert one(src.read(), names.NET_IO, **{names.DIRECTION: "receive"}) == 1500
    tree(tmp_path, [dev_line("eth0", 100, 2600)])  # driver reset of rx
    out = src.read()
    assert one(out, names.NET_IO, **{names.DIRECTION: "receive"}) == 1600
    assert one(out, names.NET_IO, **{names.DIRECTION: "transmit"}) == 2600
    assert src.partial_errors == 1
    assert src.describe()["counter_resets"] == 1


def test_interface_disappears_and_returns(tmp_path):
    sys_root, proc_root = tree(tmp_path, [dev_line("eth0", 10, 10), dev_line("veth1", 500, 700)])
    src = NetSource(sys_root, proc_root)
    src.read()
    tree(tmp_path, [dev_line("eth0", 20, 20)])
    out = src.read()
    assert not values(out, names.NET_IO, **{names.IFACE: "veth1"})
    tree(tmp_path, [dev_line("eth0", 30, 30), dev_line("veth1", 3, 4)])  # recreated: counters restart
    out = src.read()
    assert one(out, names.NET_IO, **{names.IFACE: "veth1", names.DIRECTION: "receive"}) == 503
    assert src.partial_errors == 0  # not an error: the interface was gone


def test_sys_statistics_fallback(tmp_path):
    files = {}
    for iface, base in (("eth0", 100), ("lo", 7)):
        for i, stem in enumerate(("bytes", "packets", "errors", "dropped")):
            files[f"sys/class/net/{iface}/statistics/rx_{stem}"] = f"{base + i}\n"
            files[f"sys/class/net/{iface}/statistics/tx_{stem}"] = f"{base * 2 + i}\n"
    files["sys/class/net/eth0/speed"] = "1000\n"
    write_tree(tmp_path, files)
    src = NetSource(str(tmp_path / "sys"), str(tmp_path / "no-proc"))
    out = src.read()
    assert one(out, names.NET_IO, **{names.DIRECTION: "receive"}) == 100
    assert one(out, names.NET_DROPPED, **{names.DIRECTION: "transmit"}) == 203
    assert one(out, names.NET_LIMIT) == 125e6
    assert src.describe()["counters_from"].endswith("class/net")


def test_nothing_readable_raises(tmp_path):
    with pytest.raises(SourceError, match="net/dev"):
        NetSource(str(tmp_path / "sys"), str(tmp_path / "proc")).read()
    assert NetSource(str(tmp_path / "sys"), str(tmp_path / "proc")).describe()["unreadable"]


def test_speed_is_cached(tmp_path):
    now = [0.0]
    sys_root, proc_root = tree(tmp_path, [dev_line("eth0", 1, 1)], speeds={"eth0": 10000})
    src = NetSource(sys_root, proc_root, speed_refresh_s=10, clock=lambda: now[0])
    assert one(src.read(), names.NET_LIMIT) == 10e9 / 8
    tree(tmp_path, [dev_line("eth0", 1, 1)], speeds={"eth0": 100000})
    now[0] = 5
    assert one(src.read(), names.NET_LIMIT) == 10e9 / 8
    now[0] = 11
    assert one(src.read(), names.NET_LIMIT) == 100e9 / 8


def test_real_machine():
    if not os.path.exists("/proc/net/dev"):
        pytest.skip("no /proc/net/dev on this system")
    src = NetSource()
    src.read()
    start = time.perf_counter()
    out = src.read()
    elapsed = time.perf_counter() - start
    ifaces = {r.attributes[names.IFACE] for r in out if r.spec is names.NET_IO}
    assert "lo" not in ifaces
    assert ifaces == {i["name"] for i in src.describe()["interfaces"]}
    assert all(r.value >= 0 for r in out)
    assert elapsed < 0.020, f"one read took {elapsed * 1000:.1f} ms"
    print(f"net read: {elapsed * 1e3:.2f} ms, {len(out)} readings")
    try:  # a virtual interface answers EINVAL for speed: no limit reading for it
        with open("/sys/class/net/lo/speed") as f:
            f.read()
    except OSError as e:
        assert e.errno == errno.EINVAL
        assert not values(NetSource(exclude=()).read(), names.NET_LIMIT, **{names.IFACE: "lo"})
