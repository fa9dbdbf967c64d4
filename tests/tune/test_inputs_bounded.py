"""tune's inputs read within bounds: a space or base config that never ends, a FIFO nobody writes to,
a pipe from the shell, values nested past what a parser can take, a study name that would leave
otel-gpu-tune/. Each is one line and exit 2, never a hang or an internal error."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.read_bounded import read_bytes
from otel_gpu.tune.cli import study_name
from tests.childenv import clean_env

REPO = Path(__file__).resolve().parents[2]
DS = '{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}'


def _tune(tmp_path, *args: str, pass_fds=()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_gpu", "tune", "--command", "true {config}", "--trials", "1",
                           "--out", str(tmp_path / "out"), *args], env={**clean_env(), "PYTHONPATH": str(REPO)},
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, pass_fds=pass_fds)


def _one_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "internal error" not in proc.stderr, proc.stderr
    return proc.stderr


@pytest.fixture
def ds(tmp_path) -> Path:
    path = tmp_path / "ds.json"
    path.write_text(DS)
    return path


def test_a_space_that_never_ends_is_refused_at_its_bound(tmp_path, ds):
    assert "larger than 1 MiB" in _one_line(_tune(tmp_path, "--base-config", str(ds), "--space", "/dev/zero"))


def test_a_fifo_nobody_writes_to_is_one_line_not_a_hang(tmp_path, ds):
    os.mkfifo(tmp_path / "fifo")
    assert "nothing to read" in _one_line(_tune(tmp_path, "--base-config", str(ds), "--space", str(tmp_path / "fifo")))
    assert "nothing to read" in _one_line(_tune(tmp_path, "--base-config", str(tmp_path / "fifo")))


def test_a_base_config_from_a_pipe_is_read_like_a_file(tmp_path):
    r, w = os.pipe()
    os.write(w, DS.encode())
    os.close(w)
    try:
        out = _one_line(_tune(tmp_path, "--base-config", f"/dev/fd/{r}", pass_fds=(r,)))
    finally:
        os.close(r)
    assert "zero_optimization.stage is not 3" in out   # it was read (and found to be ZeRO-2)


@pytest.mark.parametrize("name, text", [("deep.json", '{"a":' * 50_000 + "1" + "}" * 50_000),
                                         ("big.json", '{"a": "' + "x" * (5 << 20) + '"}')], ids=["deep", "big"])
def test_a_base_config_nested_too_deep_or_too_large_is_one_line(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    out = _one_line(_tune(tmp_path, "--base-config", str(tmp_path / name)))
    assert "nested too deep" in out or "larger than 4 MiB" in out


def test_a_study_name_leaving_its_folder_is_refused(tmp_path, ds):
    assert "names a folder under otel-gpu-tune/" in _one_line(_tune(tmp_path, "--base-config", str(ds),
                                                                    "--study-name", "../../../x"))
    assert not (tmp_path.parent.parent / "x").exists()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_a_study_name_is_accepted_only_as_one_folder_below_otel_gpu_tune(text):
    try:
        name = study_name(text)
    except argparse.ArgumentTypeError:
        return
    folder = (Path("/r/otel-gpu-tune") / name).resolve()
    assert folder.parent == Path("/r/otel-gpu-tune") and folder.name == name


@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=3000), bound=st.integers(0, 3000))
def test_read_bytes_gives_the_file_or_names_its_bound(tmp_path_factory, data, bound):
    path = tmp_path_factory.mktemp("r") / "f"
    path.write_bytes(data)
    if len(data) <= bound:
        assert read_bytes(path, bound) == data
    else:
        with pytest.raises(OSError, match="larger than"):
            read_bytes(path, bound)
