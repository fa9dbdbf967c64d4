import shutil
import time

import pytest

from otel_gpu import names
from otel_gpu.sources.infiniband import InfinibandSource, parse_counter, parse_rate, parse_state, pick
from fstree import SAMPLES, materialize_ttar, one, read_expected, read_tsv, read_ttar, values, write_tree

IB = SAMPLES / "infiniband"
NE = "node_infiniband_"


def port(dev, p):
    return {names.IB_DEVICE: dev, names.IB_PORT: p}


def test_parsers():
    assert parse_rate("100 Gb/sec (4X EDR)\n") == 100e9 / 8
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5e9 / 8
    assert parse_rate("10 Gb/sec (4X)") == 1.25e9
    assert parse_rate("weird") is None
    assert parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_state("1: DOWN") == (1, "DOWN")
    assert parse_state("") is None
    assert parse_counter("N/A (no PMA)\n") is None
    assert parse_counter("4294967295\n") == 2**32 - 1
    assert pick([0, 6825908347]) == 6825908347  # mlx4: 64-bit packets stuck at 0
    assert pick([None, 5]) == 5 and pick([None, None]) is None


def test_tsv_and_ttar_agree(tmp_path):
    files, dirs = read_ttar(IB / "node_exporter_sys_class_infiniband.ttar")
    assert files == read_tsv(IB / "node_exporter_sys_class_infiniband_flat.tsv")
    assert "sys/class/infiniband/mlx4_0/ports/2" in dirs


@pytest.fixture
def sample(tmp_path):
    materialize_ttar(IB / "node_exporter_sys_class_infiniband.ttar", tmp_path)
    return tmp_path


def test_matches_node_exporter(sample):
    exp = read_expected(IB / "node_exporter_e2e_expected_node_infiniband.txt")

    def ne(metric, dev, p):
        return exp.get((NE + metric, frozenset({("device", dev), ("port", p)})))

    src = InfinibandSource(str(sample / "sys"))
    out = src.read()
    assert src.partial_errors == 0
    ports = {(r.attributes[names.IB_DEVICE], r.attributes[names.IB_PORT]) for r in out}
    assert ports == {("i40iw0", "1"), ("mlx4_0", "1"), ("mlx4_0", "2")}
    for dev, p in ports:
        attrs = port(dev, p)
        assert one(out, names.NET_LIMIT, **attrs) == ne("rate_bytes_per_second", dev, p)
        assert one(out, names.IB_UP, **attrs) == (ne("state_id", dev, p) == 4)
        assert one(out, names.IB_UP, **attrs) == 1
        lim = values(out, names.NET_LIMIT, **attrs)
        assert dict(next(iter(lim))) == {names.HW_ID: f"{dev}/{p}", names.HW_TYPE: "network", **attrs}
    # i40iw0 has no performance agent: every counter reads "N/A (no PMA)"
    assert not values(out, names.IB_IO, **port("i40iw0", "1"))
    assert not values(out, names.IB_ERRORS, **port("i40iw0", "1"))
    for dev, p in (("mlx4_0", "1"), ("mlx4_0", "2")):
        for direction, ne_dir in (("receive", "received"), ("transmit", "transmitted")):
            # 64-bit counters_ext is what node_exporter calls "legacy"; take the larger of the two
            expected = max(ne(f"port_data_{ne_dir}_bytes_total", dev, p), ne(f"legacy_data_{ne_dir}_bytes_total", dev, p))
            assert one(out, names.IB_IO, **port(dev, p), **{names.DIRECTION: direction}) == expected
            expected = max(ne(f"port_packets_{ne_dir}_total", dev, p) or 0, ne(f"legacy_packets_{ne_dir}_total", dev, p))
            assert one(out, names.IB_PACKETS, **port(dev, p), **{names.DIRECTION: direction}) == expected
    assert one(out, names.IB_IO, **port("mlx4_0", "1"), **{names.DIRECTION: "receive"}) == 4631917 * 4
    assert one(out, names.IB_PACKETS, **port("mlx4_0", "1"), **{names.DIRECTION: "receive"}) == 6825908347
    errors = {
        "link_downed": "link_downed_total", "link_error_recovery": "link_error_recovery_total",
        "port_rcv_constraint_errors": "port_constraint_errors_received_total",
        "port_xmit_constraint_errors": "port_constraint_errors_transmitted_total",
        "port_rcv_discards": "port_discards_received_total", "port_xmit_discards": "port_discards_transmitted_total",
        "port_rcv_errors": "port_errors_received_total",
    }
    for dev, p in (("mlx4_0", "1"), ("mlx4_0", "2")):
        got = {dict(k)[names.ERROR_TYPE]: v for k, v in values(out, names.IB_ERRORS, **port(dev, p)).items()}
        want = {t: ne(m, dev, p) for t, m in errors.items() if ne(m, dev, p) is not None}
        assert got == want
    assert one(out, names.IB_ERRORS, **port("mlx4_0", "1"), **{names.ERROR_TYPE: "port_xmit_discards"}) == 5
    d = src.describe()
    assert [(x["device"], x["port"]) for x in d["ports"]] == [("i40iw0", "1"), ("mlx4_0", "1"), ("mlx4_0", "2")]
    assert d["ports"][1]["rate"] == "40 Gb/sec (4X QDR)"
    assert any("i40iw0/ports/1/counters/port_rcv_data: N/A (no PMA)" in u for u in d["unreadable"])
    # 64-bit data counters; basic packet counters where mlx4's 64-bit ones stay 0
    assert d["ports"][1]["counters"][:4] == ["counters_ext/port_xmit_data_64", "counters_ext/port_rcv_data_64",
                                             "counters/port_xmit_packets", "counters/port_rcv_packets"]
    assert d["saturated"] == []  # port_xmit_wait is saturated there, but it is not read


def test_saturated_32bit_counter_is_reported(tmp_path):
    src = InfinibandSource(_port(tmp_path, {"port_rcv_data": 2**32 - 1}))
    assert one(src.read(), names.IB_IO) == (2**32 - 1) * 4
    assert src.describe()["saturated"] == [str(tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data")]


def _port(root, counters, ext=None, state="4: ACTIVE", rate="100 Gb/sec (4X EDR)", dev="mlx5_0", p="1"):
    base = f"sys/class/infiniband/{dev}/ports/{p}/"
    files = {base + "state": state + "\n", base + "rate": rate + "\n", base + "link_layer": "InfiniBand\n"}
    files.update({base + "counters/" + k: f"{v}\n" for k, v in counters.items()})
    files.update({base + "counters_ext/" + k: f"{v}\n" for k, v in (ext or {}).items()})
    write_tree(root, files)
    return str(root / "sys")


def test_32bit_wrap(tmp_path):
    near = 2**32 - 100
    sys_root = _port(tmp_path, {"port_xmit_data": near, "port_rcv_data": 10, "symbol_error": 1})
    src = InfinibandSource(sys_root)
    assert one(src.read(), names.IB_IO, **{names.DIRECTION: "transmit"}) == near * 4
    _port(tmp_path, {"port_xmit_data": 50, "port_rcv_data": 20, "symbol_error": 1})  # wrapped past 2**32
    out = src.read()
    assert one(out, names.IB_IO, **{names.DIRECTION: "transmit"}) == (2**32 + 50) * 4
    assert one(out, names.IB_IO, **{names.DIRECTION: "receive"}) == 80
    _port(tmp_path, {"port_xmit_data": 70, "port_rcv_data": 20, "symbol_error": 1})
    assert one(src.read(), names.IB_IO, **{names.DIRECTION: "transmit"}) == (2**32 + 70) * 4
    assert src.partial_errors == 0
    assert src.describe()["counter_wraps"] == 1


def test_64bit_preferred_and_reset(tmp_path):
    sys_root = _port(tmp_path, {"port_xmit_data": 5}, ext={"port_xmit_data_64": 2**33 + 5})
    src = InfinibandSource(sys_root)
    assert one(src.read(), names.IB_IO) == (2**33 + 5) * 4
    assert src.describe()["ports"][0]["counters"] == ["counters_ext/port_xmit_data_64"]
    _port(tmp_path, {"port_xmit_data": 1}, ext={"port_xmit_data_64": 1})  # counters reset (perfquery -R)
    assert one(src.read(), names.IB_IO) == (2**33 + 6) * 4
    assert src.partial_errors == 1 and src.resets == 1


def test_missing_counters_and_down_port(tmp_path):
    sys_root = _port(tmp_path, {}, state="1: DOWN", rate="10 Gb/sec (4X)")
    src = InfinibandSource(sys_root)
    out = src.read()
    assert one(out, names.IB_UP) == 0
    assert one(out, names.NET_LIMIT) == 1.25e9
    assert not values(out, names.IB_IO) and not values(out, names.IB_ERRORS)
    assert src.partial_errors == 0


def test_port_disappears(tmp_path):
    sys_root = _port(tmp_path, {"port_xmit_data": 1}, p="1")
    _port(tmp_path, {"port_xmit_data": 2}, p="2")
    src = InfinibandSource(sys_root)
    assert len(values(src.read(), names.IB_UP)) == 2
    shutil.rmtree(tmp_path / "sys/class/infiniband/mlx5_0/ports/2")
    out = src.read()
    assert list(values(out, names.IB_UP)) == [tuple(sorted({names.HW_ID: "mlx5_0/1", names.HW_TYPE: "network",
                                                            **port("mlx5_0", "1")}.items()))]
    assert src.partial_errors == 0


def test_unreadable_counter_is_partial_error(tmp_path):
    sys_root = _port(tmp_path, {"port_xmit_data": 1})
    (tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data").mkdir()  # read -> EISDIR
    src = InfinibandSource(sys_root)
    out = src.read()
    assert one(out, names.IB_IO) == 4
    assert src.partial_errors == 1
    assert any("port_rcv_data: Is a directory" in u for u in src.describe()["unreadable"])


def test_no_infiniband(tmp_path):
    src = InfinibandSource(str(tmp_path))
    assert src.read() == []
    assert src.describe()["ports"] == []


def test_read_is_cheap(sample):
    src = InfinibandSource(str(sample / "sys"))
    src.read()
    start = time.perf_counter()
    src.read()
    elapsed = time.perf_counter() - start
    print(f"infiniband read (3 ports): {elapsed * 1e3:.2f} ms")
    assert elapsed < 0.020


def test_choice_settles_after_idle_start_and_survives_file_loss(tmp_path):
    sys_root = _port(tmp_path, {"port_rcv_data": 0}, ext={"port_rcv_data_64": 0})
    src = InfinibandSource(sys_root)
    assert one(src.read(), names.IB_IO) == 0  # both 0: undecided, both read again next time
    _port(tmp_path, {"port_rcv_data": 100}, ext={"port_rcv_data_64": 100})
    assert one(src.read(), names.IB_IO) == 400
    assert src.describe()["ports"][0]["counters"] == ["counters_ext/port_rcv_data_64"]
    (tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters_ext/port_rcv_data_64").unlink()
    assert not values(src.read(), names.IB_IO)  # the chosen file vanished: looked at afresh next read
    _port(tmp_path, {"port_rcv_data": 150})
    assert one(src.read(), names.IB_IO) == 600
    assert src.partial_errors == 0
