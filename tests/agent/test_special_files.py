"""`agent --once` over /proc and /sys trees holding what those files never are: a FIFO (with no
writer, or a writer that writes nothing), a link to /dev/zero. Each read ends at once; the
snapshot is taken (it hung on a FIFO at net/dev or at a link-speed file)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_gpu.sources.procfields import MAX_READ, read_text
from tests.childenv import clean_env

REPO = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    proc, sys_ = tmp_path / "proc", tmp_path / "sys"
    (proc / "net").mkdir(parents=True)
    for name in ("stat", "meminfo", "vmstat", "diskstats"):
        shutil.copyfile(f"/proc/{name}", proc / name)
    shutil.copyfile("/proc/net/dev", proc / "net" / "dev")
    (sys_ / "class" / "net" / "eth0" / "statistics").mkdir(parents=True)
    (sys_ / "class" / "net" / "eth0" / "speed").write_text("1000\n")
    return proc, sys_


def _once(proc: Path, sys_: Path) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "agent", "--once", "--no-gpu", "--proc-root", str(proc),
                          "--sys-root", str(sys_)], env={**clean_env(), "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=60)
    assert time.monotonic() - t0 < 20
    return out


@pytest.mark.parametrize("where", ["net/dev", "speed"])
@pytest.mark.parametrize("writer", [False, True], ids=["no-writer", "silent-writer"])
def test_a_fifo_in_the_tree_does_not_hold_the_snapshot(tmp_path, where, writer):
    proc, sys_ = _tree(tmp_path)
    path = proc / "net" / "dev" if where == "net/dev" else sys_ / "class" / "net" / "eth0" / "speed"
    path.unlink()
    os.mkfifo(path)
    holder = subprocess.Popen(["sh", "-c", 'exec sleep 60 > "$0"', str(path)]) if writer else None
    try:
        out = _once(proc, sys_)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    assert out.returncode == 0, out.stderr
    assert "otelgpu.agent.source.up{otelgpu.source=net}" in out.stdout


def test_a_link_to_dev_zero_is_refused_at_its_bound(tmp_path):
    proc, sys_ = _tree(tmp_path)
    (proc / "net" / "dev").unlink()
    (proc / "net" / "dev").symlink_to("/dev/zero")
    assert _once(proc, sys_).returncode == 0
    with pytest.raises(OSError, match=f"larger than {MAX_READ >> 20} MiB"):
        read_text(str(proc / "net" / "dev"))
