import os
import shutil
import subprocess
import time

import pytest

from otel_gpu import names
from otel_gpu.readings import SourceError
from otel_gpu.sources.disk import (DiskSource, Mount, existing_ancestor, mount_of, parse_diskstats,
                                   parse_mountinfo, parse_mounts)
from fstree import SAMPLES, one, read_expected, values, write_tree

DS = SAMPLES / "diskstats"
DISKSTATS = (DS / "node_exporter_proc_diskstats.txt").read_text()
PARTITIONS = ("sda1", "sda2", "sda3", "sda4", "mmcblk0p1", "mmcblk0p2", "vda1", "vda2",
              "nvme0n1p1", "nvme0n1p2", "sdb1", "sdb2", "sdc1")


def sys_block(root, partitions=PARTITIONS, disks=("sda", "vda")):
    files = {f"sys/class/block/{p}/partition": "1\n" for p in partitions}
    files.update({f"sys/class/block/{d}/size": "1\n" for d in disks})
    write_tree(root, files)
    return str(root / "sys")


def test_parse_14_18_20_fields():
    by_name = {s.name: s for s in parse_diskstats(DISKSTATS)}
    assert len(by_name) == 51
    assert by_name["sda"].read_sectors == 1003346126 and by_name["sda"].io_ms == 9653880  # 14 fields
    assert by_name["sdb"].writes == 41822 and by_name["sdb"].write_ms == 5007             # 18 fields
    assert by_name["sdc"].reads == 126552 and by_name["sdc"].io_ms == 10730               # 20 fields
    assert parse_diskstats("8 0 sda 1 2 3\n") == []


def test_matches_node_exporter(tmp_path):
    write_tree(tmp_path, {"proc/diskstats": DISKSTATS})
    out = DiskSource(str(tmp_path / "proc"), str(tmp_path / "sys"), all_devices=True).read()
    exp = read_expected(DS / "node_exporter_e2e_expected_node_disk.txt")
    checks = {
        "read_bytes_total": (names.DISK_IO, "read"), "written_bytes_total": (names.DISK_IO, "write"),
        "reads_completed_total": (names.DISK_OPERATIONS, "read"), "writes_completed_total": (names.DISK_OPERATIONS, "write"),
        "read_time_seconds_total": (names.DISK_OPERATION_TIME, "read"),
        "write_time_seconds_total": (names.DISK_OPERATION_TIME, "write"),
        "io_time_seconds_total": (names.DISK_IO_TIME, None),
    }
    compared = 0
    for (metric, labels), want in exp.items():
        key = metric.removeprefix("node_disk_")
        if key not in checks:
            continue
        spec, direction = checks[key]
        attrs = {names.DEVICE: dict(labels)["device"]}
        if direction:
            attrs[names.DISK_DIRECTION] = direction
        assert one(out, spec, **attrs) == pytest.approx(want, rel=1e-12), (metric, labels)
        compared += 1
    assert compared == 15 * 7


def test_whole_disks_only(tmp_path):
    write_tree(tmp_path, {"proc/diskstats": DISKSTATS})
    src = DiskSource(str(tmp_path / "proc"), sys_block(tmp_path))
    devices = {r.attributes[names.DEVICE] for r in src.read()}
    assert devices == {"sda", "sdb", "sdc", "vda", "nvme0n1", "mmcblk0", "fd0", "sr0",
                       "dm-0", "dm-1", "dm-2", "dm-3", "dm-4", "dm-5"}
    d = src.describe()
    assert "sda1" in d["skipped"] and "loop0" in d["skipped"] and "ram15" in d["skipped"]
    assert d["partitions_known"] is True


def test_without_sys_keeps_all_but_loop_and_ram(tmp_path):
    write_tree(tmp_path, {"proc/diskstats": DISKSTATS})
    src = DiskSource(str(tmp_path / "proc"), str(tmp_path / "no-sys"))
    devices = {r.attributes[names.DEVICE] for r in src.read()}
    assert "sda1" in devices and "sda" in devices
    assert not any(d.startswith(("loop", "ram")) for d in devices)
    assert len(devices) == 51 - 24


def _line(name, rs, ws, read_ms, io_ms):
    return f"   8       0 {name} 10 0 {rs} {read_ms} 20 0 {ws} 7 0 {io_ms} 9\n"


def test_wrap_reset_and_device_coming_back(tmp_path):
    proc = tmp_path / "proc"
    write_tree(tmp_path, {"proc/diskstats": _line("sda", 100, 200, 2**32 - 10, 5) + _line("sdb", 1, 1, 1, 1)})
    src = DiskSource(str(proc), str(tmp_path / "no-sys"))
    src.read()
    # read_ms wrapped (32-bit in the kernel's output); sectors read reset (not a wrap: 64-bit)
    write_tree(tmp_path, {"proc/diskstats": _line("sda", 50, 300, 20, 6)})
    out = src.read()
    assert one(out, names.DISK_OPERATION_TIME, **{names.DEVICE: "sda", names.DISK_DIRECTION: "read"}) == pytest.approx((2**32 + 20) / 1e3)
    assert one(out, names.DISK_IO, **{names.DEVICE: "sda", names.DISK_DIRECTION: "read"}) == 150 * 512
    assert one(out, names.DISK_IO, **{names.DEVICE: "sda", names.DISK_DIRECTION: "write"}) == 300 * 512
    assert not values(out, names.DISK_IO, **{names.DEVICE: "sdb"})  # unplugged: dropped
    assert src.partial_errors == 1 and src.wraps == 1 and src.resets == 1
    write_tree(tmp_path, {"proc/diskstats": _line("sda", 60, 300, 20, 6) + _line("sdb", 0, 0, 0, 0)})
    out = src.read()
    assert one(out, names.DISK_IO, **{names.DEVICE: "sdb", names.DISK_DIRECTION: "read"}) == 512
    assert src.partial_errors == 1  # a device that was gone starting over is no error


def test_mountinfo_parsing():
    text = ("22 27 0:21 / /proc rw,relatime - proc proc rw\n"
            "27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            "40 27 8:1 / /mnt/my\\040data rw - xfs /dev/sdb1 rw\n"
            "41 40 0:50 / /mnt/my\\040data/ckpt rw - nfs4 srv:/export rw\n")
    mounts = parse_mountinfo(text)
    assert mounts[2] == Mount("/mnt/my data", "/dev/sdb1", "xfs")
    assert mount_of("/mnt/my data/ckpt/step-10", mounts).device == "srv:/export"
    assert mount_of("/mnt/my data/x", mounts).device == "/dev/sdb1"
    assert mount_of("/mnt/my datax", mounts).device == "/dev/vda"
    assert mount_of("/", mounts).device == "/dev/vda"
    over = mounts + [Mount("/mnt/my data", "tmpfs", "tmpfs")]  # mounted over: the later one is on top
    assert mount_of("/mnt/my data/x", over).device == "tmpfs"
    assert parse_mounts("/dev/vda / ext4 rw 0 0\ntmpfs /run tmpfs rw 0 0\n")[1] == Mount("/run", "tmpfs", "tmpfs")


def test_existing_ancestor(tmp_path):
    assert existing_ancestor(str(tmp_path / "a" / "b")) == str(tmp_path)
    assert existing_ancestor(str(tmp_path)) == str(tmp_path)


def test_filesystem_usage_matches_df(tmp_path):
    if shutil.which("df") is None:
        pytest.skip("no df to compare with")
    real_mountinfo = "/proc/self/mountinfo"
    if not os.path.exists(real_mountinfo):
        pytest.skip("no /proc/self/mountinfo")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    src = DiskSource(paths=[str(ckpt), str(tmp_path)])
    out = src.read()
    df = subprocess.run(["df", "-B1", "--output=source,target,used,avail", str(ckpt)],
                        capture_output=True, text=True, check=True).stdout.splitlines()[1].split()
    device, target, used, avail = df[0], df[1], int(df[2]), int(df[3])
    attrs = {names.MOUNTPOINT: target}
    # one series even though both paths live on one filesystem; usage may move a little between calls
    assert len(values(out, names.FS_USAGE, **{names.FS_STATE: "used"})) == 1
    assert one(out, names.FS_USAGE, **attrs, **{names.FS_STATE: "used"}) == pytest.approx(used, rel=0.01)
    assert one(out, names.FS_USAGE, **attrs, **{names.FS_STATE: "free"}) == pytest.approx(avail, rel=0.01)
    assert one(out, names.FS_UTILIZATION, **attrs) == pytest.approx(used / (used + avail), abs=0.01)
    assert one(out, names.FS_UTILIZATION, **attrs, **{names.DEVICE: device}) > 0


def test_filesystem_from_fixture_mounts_and_failing_statvfs(tmp_path):
    write_tree(tmp_path, {"proc/diskstats": _line("sda", 1, 1, 1, 1),
                          "proc/mounts": f"/dev/sda1 / ext4 rw 0 0\n/dev/nvme0n1 {tmp_path} xfs rw 0 0\n"})
    calls = []

    def statvfs(path):
        calls.append(path)
        if len(calls) > 1:
            raise OSError(5, "Input/output error")
        return os.statvfs_result((4096, 4096, 1000, 400, 300, 0, 0, 0, 0, 255))

    src = DiskSource(str(tmp_path / "proc"), str(tmp_path / "sys"), paths=[str(tmp_path / "ckpt")], statvfs=statvfs)
    out = src.read()
    attrs = {names.DEVICE: "/dev/nvme0n1", names.MOUNTPOINT: str(tmp_path)}
    assert one(out, names.FS_USAGE, **attrs, **{names.FS_STATE: "used"}) == 600 * 4096
    assert one(out, names.FS_USAGE, **attrs, **{names.FS_STATE: "free"}) == 300 * 4096
    assert one(out, names.FS_UTILIZATION, **attrs) == pytest.approx(600 / 900)
    assert calls == [str(tmp_path)]  # ckpt/ does not exist yet: its parent's filesystem
    out = src.read()
    assert not values(out, names.FS_USAGE) and values(out, names.DISK_IO)
    assert src.partial_errors == 1
    d = src.describe()
    assert any("ckpt: Input/output error" in u for u in d["unreadable"])
    assert any(u.endswith("self/mountinfo: No such file or directory") for u in d["unreadable"])
    assert d["filesystems"][0]["fstype"] == "xfs"


def test_no_diskstats(tmp_path):
    with pytest.raises(SourceError, match="diskstats"):
        DiskSource(str(tmp_path), str(tmp_path)).read()
    src = DiskSource(str(tmp_path), str(tmp_path), paths=[str(tmp_path)])  # filesystem still readable
    assert values(src.read(), names.FS_USAGE)
    assert src.partial_errors == 1


def test_real_machine(tmp_path):
    if not os.path.exists("/proc/diskstats"):
        pytest.skip("no /proc/diskstats on this system")
    src = DiskSource(paths=[str(tmp_path)])
    src.read()
    start = time.perf_counter()
    out = src.read()
    elapsed = time.perf_counter() - start
    devices = {r.attributes[names.DEVICE] for r in out if r.spec is names.DISK_IO}
    assert devices and not any(d.startswith("loop") for d in devices)
    assert all(r.value >= 0 for r in out)
    assert 0 < one(out, names.FS_UTILIZATION) < 1
    print(f"disk read: {elapsed * 1e3:.2f} ms, {len(out)} readings")
    assert elapsed < 0.020


def test_path_outside_every_mount(tmp_path):
    write_tree(tmp_path, {"proc/diskstats": "", "proc/mounts": "/dev/sda1 /data ext4 rw 0 0\n"})
    src = DiskSource(str(tmp_path / "proc"), str(tmp_path / "sys"), paths=[str(tmp_path)])
    out = src.read()
    assert one(out, names.FS_UTILIZATION) >= 0
    assert {frozenset(r.attributes) for r in out if r.spec is names.FS_UTILIZATION} == {frozenset({names.MOUNTPOINT})}
    assert src.describe()["filesystems"][0]["device"] is None
