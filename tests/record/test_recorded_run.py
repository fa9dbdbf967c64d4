"""A real recorded 2-rank run: every family, every rank, profiles, exit status, exit time, a crash."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from otel_gpu import names as N
from otel_gpu.record.reader import Recording
from tests.childenv import clean_env

from .conftest import HERE, REPO, RUN, record, torchrun

pytestmark = pytest.mark.slow

AGENT_FAMILIES = {N.GPU_UTILIZATION.name, N.GPU_SM_ACTIVITY.name, N.GPU_MEMORY_USAGE.name, N.GPU_POWER.name,
                  N.CPU_UTILIZATION.name, N.MEMORY_UTILIZATION.name, N.NET_IO.name, N.DISK_IO.name}
TRAIN_FAMILIES = {N.TRAIN_STEPS.name, N.TRAIN_STEP_DURATION.name, N.TRAIN_PHASE_TIME.name}


def test_every_family_and_every_rank_is_recorded(two_rank_run):
    r = two_rank_run
    assert r.proc.returncode == 0, r.proc.stderr[-3000:]
    with Recording.open([r.directory]) as rec:
        assert AGENT_FAMILIES | TRAIN_FAMILIES <= set(rec.metrics())
        steps = rec.series(N.TRAIN_STEPS.name)
        assert sorted(s.get(N.RANK) for s in steps) == ["0", "1"]
        assert all(s.points[-1][1] == 249 for s in steps)     # 250 optimizer steps: the first opens the count
        job = rec.job
        assert job == "ddp_untouched"
        # the agent's identity joins the ranks': same host and job on its series
        gpu = rec.series(N.GPU_UTILIZATION.name)
        assert len(gpu) == 2 and {s.get(N.JOB) for s in gpu} == {job} and {s.get(N.HOST) for s in gpu} == {steps[0].get(N.HOST)}
        # profiles of both ranks, tagged by rank and phase
        rows = list(rec.profile_stacks())
        assert {labels["rank"] for _, _, labels, _ in rows} == {"0", "1"}
        # backward is most of this job's phased time (~0.55 s per rank, ~28 samples at 50 Hz); its
        # optimizer steps total ~30 ms, one or two samples: too few to require
        for rank in ("0", "1"):
            assert any(labels.get("phase") == "backward" and labels["rank"] == rank for _, _, labels, _ in rows)
        assert all(unit == "nanoseconds" for _, _, _, unit in rows)
        assert rec.metas[0]["exit_status"] == "0"


def test_run_exits_within_a_second_of_the_command_and_prints_the_summary(two_rank_run):
    r = two_rank_run
    lag = r.run_exit - r.command_exit
    assert 0 <= lag < 1.0, f"otel-gpu run exited {lag:.2f} s after the command"
    err = r.proc.stderr
    assert "rank 0: 250 steps" not in err and "rank 0: 249 steps, median step" in err and "rank 1: 249 steps" in err
    assert f"report {r.directory / 'report.html'}" in err or "report.html" in err.splitlines()[-1]
    assert "retrying" not in err.lower() and "connection refused" not in err.lower()
    assert "otel-gpu agent" not in err and "sampling every" in (r.directory / "agent.log").read_text()
    assert (r.directory / "report.html").stat().st_size > 100_000


def test_the_commands_exit_status_passes_through(tmp_path):
    r = record(tmp_path / "r", [sys.executable, str(REPO / "tests/training/untouched_loop.py"), "5", "7"], "--no-agent")
    assert r.proc.returncode == 7, r.proc.stderr
    with Recording.open([r.directory]) as rec:
        assert rec.metas[0]["exit_status"] == "7"
        assert rec.series(N.TRAIN_STEPS.name)[0].points[-1][1] == 4


def test_a_killed_command_leaves_a_recording_that_report_opens(tmp_path):
    pytest.importorskip("torch", reason="torch not installed")
    d, pid_file = tmp_path / "killed", tmp_path / "pid"
    env = clean_env()
    proc = subprocess.Popen(RUN + ["--record", str(d), "--no-agent", "--", *torchrun(HERE / "ddp_untouched.py", "100000", "0", str(pid_file))],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pid_file.exists(), "the training never started"
        time.sleep(4)   # a few exports and one profile push
        os.kill(int(pid_file.read_text()), signal.SIGKILL)     # rank 0 dies; torchrun tears the job down
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    with Recording.open([d]) as rec:
        steps = rec.series(N.TRAIN_STEPS.name)
        assert steps and max(s.points[-1][1] for s in steps) > 10
        assert rec.profile_count() >= 1
    rep = subprocess.run(RUN[:-1] + ["report", str(d), "-o", str(tmp_path / "r.html")], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert (tmp_path / "r.html").stat().st_size > 100_000


def test_report_and_diagnose_of_a_missing_recording_fail_in_one_line(tmp_path):
    for cmd, code in ((["report", str(tmp_path)], 1), (["report", str(tmp_path / "nope")], 2), (["diagnose", str(tmp_path)], 1)):
        p = subprocess.run([sys.executable, "-m", "otel_gpu", *cmd], env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
        assert p.returncode == code and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, (cmd, p.stderr)
