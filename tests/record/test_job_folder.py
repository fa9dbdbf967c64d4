"""A job name never steers where a recording goes: the default folder is a direct child of
./otel-gpu-runs/ for any job name, given by flag, OTELGPU_JOB or SLURM_JOB_NAME; the job name on
the metrics stays the one the user gave."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_gpu.identity import FOLDER_NAME_MAX, job_folder_name
from otel_gpu.record import session as S
from otel_gpu.record.reader import Recording
from tests.childenv import clean_env

SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@given(job=st.text() | st.sampled_from(["..", ".", "../../../escaped", "a/b", "/etc", "a/../../b", "\\..\\x", "-"]),
       now=st.floats(0, 4e9))
def test_the_folder_is_a_direct_child_of_the_root(tmp_path_factory, job, now):
    root = Path("/nonexistent-root/otel-gpu-runs")
    d = S.run_dir(root, job, now)
    assert d.parent == root
    assert SAFE.fullmatch(d.name), d.name
    assert d.name not in (".", "..")
    assert len(job_folder_name(job)) <= FOLDER_NAME_MAX


@given(job=st.text(alphabet="abcXYZ019_.-", min_size=1, max_size=FOLDER_NAME_MAX))
def test_a_safe_name_is_kept_as_it_is(job):
    if job.startswith((".", "-")) or job.endswith("-") or not job.strip("."):
        return
    assert job_folder_name(job) == job


@given(job=st.text())
def test_the_folder_name_is_a_fixed_point(job):
    once = job_folder_name(job)
    assert job_folder_name(once) == once


def _record(tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "otel_gpu", "run", "--no-agent", "--no-report", *args, "--", "true"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path, env=clean_env(**env))


@pytest.mark.parametrize("how", ["flag", "OTELGPU_JOB", "SLURM_JOB_NAME"])
@pytest.mark.parametrize("job, folder", [("../../../escaped", "escaped"), ("a/b", "a-b"), ("..", "run")])
def test_run_records_inside_the_default_root(tmp_path, how, job, folder):
    work = tmp_path / "x" / "y" / "z"
    work.mkdir(parents=True)
    args, env = (["--job", job], {}) if how == "flag" else ([], {how: job})
    proc = _record(work, args, env)
    assert proc.returncode == 0, proc.stderr
    root = work / "otel-gpu-runs"
    made = list(root.iterdir())
    assert len(made) == 1 and made[0].is_dir() and made[0].name.startswith(folder + "-"), made
    everything = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    assert all(str(p).startswith(str(Path("x", "y", "z", "otel-gpu-runs"))) or Path("x", "y", "z", "otel-gpu-runs")
               .is_relative_to(p) for p in everything), everything   # nothing escaped
    with Recording.open([made[0]]) as rec:
        assert rec.job == job   # the name the user gave, unchanged
