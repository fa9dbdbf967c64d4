"""Property tests of the /proc and /sys parsers: what the kernel writes parses back exactly,
and any other text is either parsed into sane values or refused with the exception the
source counts (ValueError, IndexError), never something else and never a wrong number."""
from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.sources import disk, host, infiniband, net, process, procenv

FAST = settings(max_examples=100, deadline=None)
counters = st.integers(0, 2**64 - 1)
iface = st.text(st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters=":|"), min_size=1, max_size=15)
junk = st.one_of(st.text(max_size=300), st.lists(st.text(max_size=30), max_size=8).map("\n".join))


@FAST
@given(st.dictionaries(iface, st.lists(counters, min_size=16, max_size=16), max_size=5))
def test_net_dev_round_trip(table):
    lines = ["Inter-|   Receive                            |  Transmit",
             " face |bytes    packets errs drop fifo frame compressed multicast|bytes ..."]
    lines += [f"{name.rjust(6)}: " + " ".join(map(str, values)) for name, values in table.items()]
    parsed = net.parse_net_dev("\n".join(lines))
    assert set(parsed) == set(table)
    for name, values in table.items():
        assert parsed[name]["rx_bytes"] == values[0] and parsed[name]["tx_bytes"] == values[8]
        assert parsed[name]["tx_drop"] == values[11]


@FAST
@given(junk)
def test_net_dev_junk(text):
    try:
        parsed = net.parse_net_dev(text)
    except ValueError:
        return
    assert all(isinstance(v, int) for row in parsed.values() for v in row.values())


@FAST
@given(st.one_of(junk, st.integers(-10**6, 10**7).map(str)))
def test_link_speed_is_positive_and_finite_or_none(text):
    value = net.speed_bytes_per_second(text)
    assert value is None or (math.isfinite(value) and value > 0)


@FAST
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300), iface, st.lists(counters, min_size=17, max_size=17)),
                max_size=5))
def test_diskstats_round_trip(rows):
    text = "\n".join(f"{major:4d} {minor:7d} {name} " + " ".join(map(str, v)) for major, minor, name, v in rows)
    parsed = disk.parse_diskstats(text)
    assert [(d.name, d.reads, d.read_sectors, d.writes, d.write_sectors, d.io_ms) for d in parsed] == \
           [(name, v[0], v[2], v[4], v[6], v[9]) for _, _, name, v in rows]


@FAST
@given(junk)
def test_diskstats_junk(text):
    try:
        disk.parse_diskstats(text)
    except ValueError:
        pass


paths = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"), min_size=1,
                         max_size=8), min_size=0, max_size=3).map(lambda parts: "/" + "/".join(parts))


def _escape(path: str) -> str:
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


@FAST
@given(st.lists(st.tuples(paths, iface, st.sampled_from(["ext4", "xfs", "nfs4", "tmpfs"])), max_size=5))
def test_mountinfo_and_mounts_round_trip_escaped_paths(mounts):
    info = "\n".join(f"{i} 1 8:1 / {_escape(mp)} rw,relatime shared:1 - {fs} {dev} rw"
                     for i, (mp, dev, fs) in enumerate(mounts))
    assert [(m.mountpoint, m.device, m.fstype) for m in disk.parse_mountinfo(info)] == mounts
    plain = "\n".join(f"{dev} {_escape(mp)} {fs} rw 0 0" for mp, dev, fs in mounts)
    assert [(m.mountpoint, m.device, m.fstype) for m in disk.parse_mounts(plain)] == mounts


@FAST
@given(junk)
def test_mount_parsers_never_raise(text):
    disk.parse_mountinfo(text)
    disk.parse_mounts(text)


@FAST
@given(st.one_of(junk, st.builds(lambda n, unit: f"{n} {unit}b/sec (4X EDR)",
                                 st.one_of(st.integers(0, 10**6).map(str), st.sampled_from(["1.5", ".", "1.2.3", ".."])),
                                 st.sampled_from(["", "K", "M", "G", "T", "g"]))))
def test_infiniband_rate_is_finite_and_non_negative_or_none(text):
    value = infiniband.parse_rate(text)
    assert value is None or (math.isfinite(value) and value >= 0)


@FAST
@given(junk)
def test_infiniband_state_and_counter_are_typed_or_none(text):
    state = infiniband.parse_state(text)
    assert state is None or (isinstance(state[0], int) and isinstance(state[1], str))
    counter = infiniband.parse_counter(text)
    assert counter is None or isinstance(counter, int)


@FAST
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0\n"), max_size=16),
       counters, counters, st.integers(0, 2**40), st.integers(0, 2**40))
def test_proc_stat_round_trip_with_any_comm(comm, utime, stime, start, rss):
    fields = ["S", "1", "1", "1", "0", "-1", "4194304", "0", "0", "0", "0", str(utime), str(stime), "0", "0",
              "20", "0", "1", "0", str(start), "1000", str(rss)] + ["0"] * 30
    stat = process.parse_stat(f"1234 ({comm}) " + " ".join(fields), clk_tck=100, page_size=4096)
    assert stat.comm == comm and stat.start_ticks == start and stat.rss_bytes == rss * 4096
    assert stat.cpu_s == (utime + stime) / 100


@FAST
@given(junk)
def test_proc_stat_and_io_junk_is_refused_as_the_source_expects(text):
    try:
        process.parse_stat(text)
    except (ValueError, IndexError):
        pass
    try:
        io = process.parse_io(text)
    except ValueError:
        return
    assert all(isinstance(v, int) for v in io.values())


@FAST
@given(st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="=\0"), min_size=1,
                               max_size=10),
                       st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=10),
                       max_size=6))
def test_environ_round_trip_and_rank(env):
    data = b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0"
    assert procenv.parse_environ(data) == env
    rank = procenv.rank_from_env(env)
    assert rank is None or (rank == rank.strip() and rank)


@FAST
@given(st.binary(max_size=200))
def test_environ_never_raises_on_bytes(data):
    assert isinstance(procenv.parse_environ(data), dict)


modes = st.fixed_dictionaries({m: st.floats(0, 1e9) for m in host.CPU_MODES})


@FAST
@given(modes, modes)
def test_cpu_fractions_are_shares_summing_to_one(prev, cur):
    shares = host.cpu_fractions(prev, cur)
    if shares is None:
        return
    assert all(0 <= v <= 1 for v in shares.values())
    assert math.isclose(sum(shares.values()), 1.0, rel_tol=1e-9)
