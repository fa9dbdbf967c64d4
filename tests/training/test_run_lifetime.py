"""`otel-gpu run` ends every process it started, however it ends: SIGKILL, SIGHUP, a SIGTERM while
it is still starting things, a command that ignores SIGTERM (SIGKILL after --grace), a command that
leaves a daemon behind. Real processes; the command is a plain script with no otel-gpu import."""
from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, clean_env

from otel_gpu.cli import build_parser
from tests.procwatch import alive, pids_with, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; death signals are Linux's")

RUN = [sys.executable, "-c", "import sys; from otel_gpu.cli import main; sys.exit(main())", "run"]
START_S = 90        # generous: a loaded 2-core machine starts Python, the receiver and the agent slowly

# what a user's job does: says it is up (with the pid of a helper it started), then works for a while
JOB = """
import os, signal, subprocess, sys, time
ready, ignore_term = sys.argv[1], sys.argv[2] == "ignore-term"
if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # inherited by the helper: it ignores SIGTERM too
helper = subprocess.Popen(["sleep", "300"])
with open(ready + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {helper.pid}")
os.rename(ready + ".tmp", ready)
time.sleep(300)
"""




class Run:
    """`otel-gpu run [args] -- python JOB READY MODE MARKER` in the background, output to files."""

    def __init__(self, tmp_path: Path, args: list[str], mode: str = "plain", env: dict | None = None):
        self.ready = tmp_path / "ready"
        self.marker = f"job-{uuid.uuid4().hex[:12]}"
        job = tmp_path / "job.py"
        job.write_text(JOB)
        self.err_path = tmp_path / "run.err"
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(RUN + args + ["--", sys.executable, str(job), str(self.ready), mode, self.marker],
                                         env=env or clean_env(), cwd=REPO, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)

    def wait_ready(self) -> tuple[int, int]:
        """(job pid, helper pid) once the job is up."""
        assert wait_until(self.ready.exists, START_S), f"the job never started: {self.stderr()}"
        job, helper = map(int, self.ready.read_text().split())
        return job, helper

    def agents(self) -> list[int]:
        return pids_with(f"--parent-pid={self.proc.pid}")

    def leftovers(self) -> list[int]:
        """The agent and every job process still alive (the run itself excluded)."""
        pids = set(self.agents()) | set(pids_with(self.marker))
        if self.ready.exists():
            pids |= set(map(int, self.ready.read_text().split()))
        pids.discard(self.proc.pid)
        return sorted(p for p in pids if alive(p))

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pid in self.leftovers():   # a failed test must not leave its processes to the next one
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def runs():
    started: list[Run] = []
    yield started
    for run in started:
        run.cleanup()


def recorded(tmp_path: Path) -> list[str]:
    return ["--no-profile", "--record", str(tmp_path / "rec"), "--agent-arg=--no-gpu"]


def test_sigkill_of_run_ends_its_agent_and_its_command(tmp_path, runs):
    run = Run(tmp_path, recorded(tmp_path))
    runs.append(run)
    job, helper = run.wait_ready()
    agent = wait_until(run.agents, START_S)
    assert agent, run.stderr()
    run.proc.kill()
    run.proc.wait()
    # the agent flushes for at most 5 s before it exits; the job gets SIGTERM from the kernel
    assert wait_until(lambda: not any(map(alive, agent + [job])), 20), f"left running: {run.leftovers()}"


def test_sighup_of_run_ends_everything_and_passes_the_status_through(tmp_path, runs):
    run = Run(tmp_path, recorded(tmp_path))
    runs.append(run)
    job, helper = run.wait_ready()
    agent = wait_until(run.agents, START_S)
    run.proc.send_signal(signal.SIGHUP)
    assert run.proc.wait(60) == 128 + signal.SIGHUP, run.stderr()
    assert wait_until(lambda: not any(map(alive, agent + [job, helper])), 10), f"left running: {run.leftovers()}"


@pytest.mark.parametrize("when", ["at once", "after 0.3 s", "as the agent appears"])
def test_an_early_sigterm_leaves_nothing_behind(tmp_path, runs, when):
    run = Run(tmp_path, recorded(tmp_path))
    runs.append(run)
    if when == "after 0.3 s":
        time.sleep(0.3)
    elif when == "as the agent appears":   # the moment today's handlers were not there yet
        assert wait_until(run.agents, START_S, poll_s=0.005), run.stderr()
    run.proc.send_signal(signal.SIGTERM)
    # killed before Python let us handle it (-15), or handled: the command's status (143)
    assert run.proc.wait(60) in (-signal.SIGTERM, 128 + signal.SIGTERM), run.stderr()
    time.sleep(0.5)   # a process started in the last instant would show up now
    assert wait_until(lambda: not run.leftovers(), 10), f"left running: {run.leftovers()}"


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path, runs):
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")   # plain OTLP mode: no recording
    run = Run(tmp_path, ["--no-profile", "--no-record", "--grace", "0.5"], mode="ignore-term", env=env)
    runs.append(run)
    job, helper = run.wait_ready()
    t0 = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(60) == 128 + signal.SIGKILL, run.stderr()
    assert 0.5 <= time.monotonic() - t0 < 20
    assert "did not exit within 0.5 s of SIGTERM; killed it (SIGKILL) with 1 process it started" in run.stderr()
    assert wait_until(lambda: not alive(job) and not alive(helper), 10)


def test_a_daemon_the_command_leaves_is_ended_when_it_exits(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    proc = subprocess.run(RUN + ["--no-profile", "--no-record", "--", "sh", "-c",
                                 f"setsid sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}; exit 3"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    daemon = int(pidfile.read_text())
    try:
        assert proc.returncode == 3, proc.stderr
        assert "ended 1 process the command left running" in proc.stderr
        assert not alive(daemon)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)


def test_the_agent_stops_when_its_parent_is_gone_without_a_death_signal(tmp_path):
    # a plain shell starts the agent (no death signal set): only the agent's own parent watch can stop it
    log = tmp_path / "agent.log"
    agent_cmd = " ".join([sys.executable, "-c", "'import sys; from otel_gpu.cli import main; sys.exit(main())'",
                          "agent", "--no-live", "--no-gpu", "--parent-pid=$$"])
    parent = subprocess.Popen(["/bin/sh", "-c", f"{agent_cmd} 2> {log} & echo $! > {tmp_path / 'agent.pid'}; wait"],
                              env=clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"), cwd=REPO)
    try:
        assert wait_until(lambda: "sampling every" in (log.read_text() if log.exists() else ""), START_S)
        agent = int((tmp_path / "agent.pid").read_text())
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not alive(agent), 20), log.read_text()
        assert f"parent process {parent.pid} is gone; stopping" in log.read_text()
    finally:
        parent.kill()
        parent.wait()


NUMBERISH = st.one_of(st.text(max_size=12), st.floats().map(repr), st.integers(-10**9, 10**9).map(str),
                      st.sampled_from(["nan", "inf", "-0", "1e400", "3600", "3600.0001", "0", " 5 ", "1_0"]))


def _parse(argv: list[str]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(argv), ""
        except SystemExit as exc:
            assert exc.code == 2
            return None, err.getvalue()


@settings(max_examples=200, deadline=None)
@given(NUMBERISH)
def test_grace_flag_is_seconds_within_bounds_or_one_line(raw):
    args, err = _parse(["run", f"--grace={raw}", "--", "true"])
    if args is None:
        assert err.strip().count("\n") == 0 and "--grace" in err
        return
    assert isinstance(args.grace, float) and math.isfinite(args.grace) and 0 <= args.grace <= 3600


@settings(max_examples=200, deadline=None)
@given(NUMBERISH)
def test_parent_pid_flag_is_a_pid_or_one_line(raw):
    args, err = _parse(["agent", f"--parent-pid={raw}"])
    if args is None:
        assert err.strip().count("\n") == 0 and "--parent-pid" in err
        return
    assert isinstance(args.parent_pid, int) and 1 <= args.parent_pid <= 4194304


def test_grace_defaults_to_ten_seconds():
    assert _parse(["run", "--", "true"])[0].grace == 10.0
