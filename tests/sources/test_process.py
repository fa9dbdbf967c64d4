import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from otel_gpu import names
from otel_gpu.sources.process import (CLK_TCK, PAGE_SIZE, PidFinder, ProcessSource, cmdline_matches, find_pids,
                                      parse_io, parse_stat)
from fstree import one, run_as_nobody, values, write_tree



def stat_line(pid, comm, utime, stime, start, rss_pages):
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194304", "0", "0", "0", "0",
              str(utime), str(stime), "0", "0", "20", "0", "1", "0", str(start), "1000", str(rss_pages)]
    return f"{pid} ({comm}) " + " ".join(fields + ["0"] * 28) + "\n"


def proc(root, pid, comm="python3", utime=0, stime=0, start=100, rss_pages=10, io=(0, 0), environ=b"", exe=None):
    files = {f"{pid}/stat": stat_line(pid, comm, utime, stime, start, rss_pages),
             f"{pid}/environ": environ, f"{pid}/cmdline": f"{comm}\0train.py\0--lr\0".encode()}
    if io is not None:
        files[f"{pid}/io"] = f"rchar: 5\nwchar: 6\nread_bytes: {io[0]}\nwrite_bytes: {io[1]}\ncancelled_write_bytes: 0\n"
    write_tree(root, files)
    if exe:
        link = root / str(pid) / "exe"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(exe)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_parse_stat_odd_comm():
    st = parse_stat(stat_line(7, "a) (b c", 300, 100, 555, 3), clk_tck=100, page_size=4096)
    assert st.comm == "a) (b c" and st.cpu_s == 4.0 and st.start_ticks == 555 and st.rss_bytes == 3 * 4096
    real = parse_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert real.rss_bytes == psutil.Process().memory_info().rss or real.rss_bytes > 0


def test_parse_io_and_cmdline():
    assert parse_io("read_bytes: 4096\nwrite_bytes: 0\n") == {"read_bytes": 4096, "write_bytes": 0}
    assert cmdline_matches(b"python\0train.py\0--x\0", ["train.py --x"])
    assert not cmdline_matches(b"", ["x"]) and not cmdline_matches(b"python\0", ["train"])


def test_fixture_reads(tmp_path):
    clock = Clock()
    proc(tmp_path, 10, utime=100, stime=0, rss_pages=5, io=(4096, 8192), environ=b"RANK=3\0", exe="/usr/bin/python3.11")
    proc(tmp_path, 11, comm="torchrun", io=None)
    src = ProcessSource(lambda: [10, 11, 99], proc_root=str(tmp_path), clock=clock)
    out = src.read()
    assert not values(out, names.PROCESS_CPU_UTILIZATION)  # needs two samples
    attrs = {names.PID: "10", names.EXECUTABLE: "python3.11", names.RANK: "3"}
    assert one(out, names.PROCESS_MEMORY, **attrs) == 5 * PAGE_SIZE
    assert one(out, names.PROCESS_DISK_IO, **attrs, **{names.DISK_DIRECTION: "read"}) == 4096
    assert one(out, names.PROCESS_DISK_IO, **attrs, **{names.DISK_DIRECTION: "write"}) == 8192
    assert one(out, names.PROCESS_MEMORY, **{names.PID: "11"}) == 10 * PAGE_SIZE
    assert names.RANK not in next(r for r in out if r.attributes[names.PID] == "11").attributes
    assert not values(out, names.PROCESS_DISK_IO, **{names.PID: "11"})
    # 2.5 s later: 3 CPU-seconds more (two threads busy) -> 1.2 cores
    clock.now += 2.5
    proc(tmp_path, 10, utime=100 + 3 * CLK_TCK, stime=0, rss_pages=5, io=(4096, 8192), environ=b"RANK=3\0",
         exe="/usr/bin/python3.11")
    out = src.read()
    assert one(out, names.PROCESS_CPU_UTILIZATION, **{names.PID: "10"}) == pytest.approx(1.2)
    assert one(out, names.PROCESS_CPU_UTILIZATION, **{names.PID: "11"}) == 0
    assert src.partial_errors == 0  # PID 99 does not exist: not an error
    d = src.describe()
    assert d["processes"] == [{"pid": 10, "executable": "python3.11", "rank": "3"},
                              {"pid": 11, "executable": "torchrun", "rank": None}]
    assert d["unreadable"] == [f"{tmp_path}/11/io: no io file (kernel without task I/O accounting)"]


def test_pid_reuse_restarts_cpu_baseline(tmp_path):
    clock = Clock()
    proc(tmp_path, 10, utime=500, start=100, environ=b"RANK=0\0")
    src = ProcessSource(lambda: [10], proc_root=str(tmp_path), clock=clock)
    src.read()
    clock.now += 1
    proc(tmp_path, 10, utime=5, start=900, environ=b"RANK=1\0")  # another process got PID 10
    out = src.read()
    assert not values(out, names.PROCESS_CPU_UTILIZATION)
    assert one(out, names.PROCESS_MEMORY)
    assert next(iter(out)).attributes[names.RANK] == "1"


def test_unreadable_io_is_noted(tmp_path):
    proc(tmp_path, 10, io=None)
    (tmp_path / "10" / "io").mkdir()  # read fails with EISDIR
    src = ProcessSource(lambda: [10], proc_root=str(tmp_path))
    out = src.read()
    assert values(out, names.PROCESS_MEMORY) and not values(out, names.PROCESS_DISK_IO)
    assert src.partial_errors == 1
    assert src.describe()["unreadable"] == [f"{tmp_path}/10/io: Is a directory"]


def _child(marker, env=None):
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()", marker],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert child.stdout.readline() == b"ready\n"
    return child


def test_real_process_exits_between_reads():
    marker = f"otel-gpu-test-{os.getpid()}-{time.time_ns()}"
    child = _child(marker, env=dict(os.environ, RANK="5"))
    try:
        assert find_pids([marker]) == [child.pid]
        src = ProcessSource.by_name([marker], pids=[os.getpid()])
        src.read()
        busy = time.process_time() + 0.1
        while time.process_time() < busy:  # burn 0.1 s of CPU in this process
            pass
        out = src.read()
        mine = {names.PID: str(os.getpid())}
        assert 0.05 < one(out, names.PROCESS_CPU_UTILIZATION, **mine) < 1.5  # ~1 unless the machine is crowded
        assert one(out, names.PROCESS_MEMORY, **mine) == pytest.approx(psutil.Process().memory_info().rss, rel=0.1)
        child_attrs = {names.PID: str(child.pid), names.RANK: "5"}
        assert one(out, names.PROCESS_MEMORY, **child_attrs) > 1e6
        assert one(out, names.PROCESS_MEMORY, **child_attrs, **{names.EXECUTABLE: Path(os.path.realpath(sys.executable)).name})
    finally:
        child.communicate(b"")
    out = src.read()  # the child exited (and was reaped): gone, silently
    assert not values(out, names.PROCESS_MEMORY, **{names.PID: str(child.pid)})
    assert values(out, names.PROCESS_MEMORY, **{names.PID: str(os.getpid())})
    assert src.partial_errors == 0
    assert src.describe()["exited"] == 1


def test_find_pids_fixture_and_rescan(tmp_path):
    proc(tmp_path, 10)
    write_tree(tmp_path, {"20/cmdline": b"bash\0", "self/cmdline": b"train.py\0", "30/cmdline": b""})
    assert find_pids(["train.py"], str(tmp_path)) == [10]
    assert find_pids([], str(tmp_path)) == []
    clock = Clock()
    finder = PidFinder(["train.py"], pids=[20], proc_root=str(tmp_path), rescan_s=5, clock=clock)
    assert finder() == [10, 20]
    proc(tmp_path, 11)
    assert finder() == [10, 20]  # not rescanned yet
    clock.now += 5
    assert finder() == [10, 11, 20]


def test_psutil_fallback_without_proc(tmp_path):
    src = ProcessSource(lambda: [os.getpid(), 2**22 + 7], proc_root=str(tmp_path / "none"))
    src.read()
    out = src.read()
    attrs = {names.PID: str(os.getpid()), names.EXECUTABLE: psutil.Process().name()}
    assert one(out, names.PROCESS_MEMORY, **attrs) > 1e6
    assert one(out, names.PROCESS_CPU_UTILIZATION, **attrs) >= 0
    assert values(out, names.PROCESS_DISK_IO, **attrs)
    assert len({r.attributes[names.PID] for r in out}) == 1  # the made-up PID is just absent


def test_permission_denied_io_as_unprivileged_user():
    """As the `nobody` user, PID 1's io file is not readable: omitted, noted, not an error."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to the nobody user")
    if not os.path.exists("/proc/1/io"):
        pytest.skip("no /proc/1/io (kernel without task I/O accounting)")
    def probe():
        s = ProcessSource(lambda: [1])
        out = s.read()
        return {"names": sorted({r.spec.name for r in out}), "errors": s.partial_errors, "describe": s.describe()}

    got = run_as_nobody(probe)
    assert got["names"] == ["process.memory.usage"]  # no CPU on a first read, no I/O without permission
    assert got["errors"] == 0
    assert got["describe"]["unreadable"] == ["/proc/1/io: Permission denied"]
    assert got["describe"]["processes"][0]["rank"] is None  # environ is not readable either


def test_read_is_cheap():
    children = [_child(f"otel-gpu-timing-{i}") for i in range(4)]
    try:
        src = ProcessSource(lambda: [os.getpid()] + [c.pid for c in children])
        src.read()
        start = time.perf_counter()
        out = src.read()
        elapsed = time.perf_counter() - start
        finder_start = time.perf_counter()
        find_pids(["otel-gpu-timing-"])
        scan = time.perf_counter() - finder_start
    finally:
        for c in children:
            c.communicate(b"")
    assert len(values(out, names.PROCESS_MEMORY)) == 5
    print(f"process read (5 processes): {elapsed * 1e3:.2f} ms; cmdline scan of /proc: {scan * 1e3:.2f} ms")
    assert elapsed < 0.020
