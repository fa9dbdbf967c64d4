import os
import subprocess
import sys

import pytest

from otel_gpu.sources.procenv import parse_environ, rank_from_env, rank_of
from fstree import run_as_nobody


def _proc(tmp_path, pid, environ: bytes):
    d = tmp_path / str(pid)
    d.mkdir()
    (d / "environ").write_bytes(environ)
    return str(tmp_path)


def test_parse_environ_nul_separated():
    env = parse_environ(b"A=1\0B=x=y\0EMPTY=\0NOEQ\0\0")
    assert env == {"A": "1", "B": "x=y", "EMPTY": ""}


def test_rank_precedence():
    assert rank_from_env({"RANK": "3", "OMPI_COMM_WORLD_RANK": "5"}) == "3"
    assert rank_from_env({"OMPI_COMM_WORLD_RANK": "5", "SLURM_PROCID": "7"}) == "5"
    assert rank_from_env({"PMI_RANK": "2", "SLURM_PROCID": "7"}) == "2"
    assert rank_from_env({"SLURM_PROCID": "7"}) == "7"
    assert rank_from_env({"RANK": "", "SLURM_PROCID": "7"}) == "7"
    assert rank_from_env({"LOCAL_RANK": "1"}) is None


def test_rank_of_fixture(tmp_path):
    root = _proc(tmp_path, 42, b"PATH=/bin\0RANK=11\0")
    assert rank_of(42, root) == "11"
    assert rank_of(43, root) is None  # missing process


def test_rank_of_permission_denied():
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to the nobody user")
    child = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True); input()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, RANK="4"))
    try:
        assert child.stdout.readline() == b"ready\n"
        assert rank_of(child.pid) == "4"  # readable as its owner

        def probe():
            try:
                open(f"/proc/{child.pid}/environ", "rb").close()
                why = "readable"
            except OSError as e:
                why = type(e).__name__
            return [why, rank_of(child.pid)]

        assert run_as_nobody(probe) == ["PermissionError", None]  # another user's environ
    finally:
        child.communicate(b"\n")


def test_rank_of_environ_is_a_directory(tmp_path):
    (tmp_path / "42" / "environ").mkdir(parents=True)
    assert rank_of(42, str(tmp_path)) is None


def test_rank_of_real_child():
    env = dict(os.environ, RANK="9")
    child = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True); input()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline() == b"ready\n"  # exec'd: environ is the child's own
        assert rank_of(child.pid) == "9"
    finally:
        child.communicate(b"\n")
    assert rank_of(child.pid) is None  # reaped: gone
