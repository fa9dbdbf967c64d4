"""Stacks on request with real processes: a blocked process's dump names the frame it blocks in; a handler
already installed is left alone; a PID whose start time does not match its file is never signalled;
the file's header is read back (Hypothesis)."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from otel_gpu import stacks
from tests.childenv import clean_env

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")

BLOCKED = textwrap.dedent("""
    import os, signal, sys, time
    from otel_gpu import stacks
    if sys.argv[1] == "taken":
        signal.signal(stacks.stack_signal(), lambda *a: None)   # the user's own handler


    def held_here():
        print(stacks.install(os.environ, "3"), flush=True)
        time.sleep(60)

    held_here()
""")


def _blocked(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-c", BLOCKED, mode], env=clean_env(OTELGPU_STACKS_DIR=str(tmp_path)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, p.stdout.readline().strip()


def test_a_blocked_process_dumps_the_frame_it_blocks_in(tmp_path):
    p, said = _blocked(tmp_path, "free")
    try:
        path = tmp_path / f"rank3-pid{p.pid}.txt"
        assert said == str(path) and path.read_text().startswith(f"# otel-gpu stacks: rank 3 pid {p.pid} signal ")
        assert stacks.latest(path) == ""                  # nothing requested yet
        (got,) = stacks.request_stacks(tmp_path)
        assert got == path
        first = stacks.latest(path)
        assert "in held_here" in first and "<module>" in first
        assert stacks.request_stacks(tmp_path, pids=[p.pid + 100000]) == []   # not one of the PIDs asked for
        time.sleep(0.05)
        stacks.request_stacks(tmp_path, pids=[p.pid])
        assert path.read_text().count(stacks.MARKER) == 2 and stacks.latest(path).count("in held_here") == 1
        assert p.poll() is None                           # a dump, not a death
    finally:
        p.kill()
        p.wait(10)


def test_a_handler_already_installed_is_left_alone(tmp_path):
    p, said = _blocked(tmp_path, "taken")
    try:
        assert said == "None" and not list(tmp_path.iterdir())
    finally:
        p.kill()
        p.wait(10)


def test_a_pid_whose_start_time_differs_is_not_signalled(tmp_path):
    other = subprocess.Popen(["sleep", "30"])
    try:
        real = stacks.start_ticks(other.pid)
        assert real is not None
        (tmp_path / f"rank0-pid{other.pid}.txt").write_text(
            f"# otel-gpu stacks: rank 0 pid {other.pid} signal {int(signal.SIGTERM)} start {real + 1}\n")
        assert stacks.request_stacks(tmp_path, timeout_s=0.3) == []
        time.sleep(0.1)
        assert other.poll() is None                       # SIGTERM was never sent
    finally:
        other.kill()
        other.wait(10)


@given(rank=st.text(max_size=40), pid=st.integers(1, 1 << 22), sig=st.integers(1, 64), start=st.integers(1, 1 << 40))
def test_the_header_reads_back(tmp_path_factory, rank, pid, sig, start):
    d = tmp_path_factory.mktemp("h")
    safe = stacks.re.sub(r"[^0-9A-Za-z_.-]", "_", rank)[:32] or "x"
    path = d / "rank-pid.txt"
    path.write_text(f"# otel-gpu stacks: rank {safe} pid {pid} signal {sig} start {start}\nThread 0x1\n")
    assert stacks._header(path) == (safe, pid, sig, start)


@given(data=st.binary(max_size=600))
def test_anything_else_is_no_header(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("g") / "rank0-pid1.txt"
    path.write_bytes(data)
    got = stacks._header(path)
    assert got is None or data.startswith(b"# otel-gpu stacks: rank ")
