"""What `otel-gpu run` started ends when run is killed (SIGKILL: no chance to act), even a command
that changed its credentials (the kernel clears its death signal then: it lived on), and the node
agent goes at once (it retried its last export to the dead receiver for 2.5-5 s)."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from otel_gpu import children, tree_guard
from tests.childenv import clean_env
from tests.procwatch import alive, pids_with, wait_until

REPO = Path(__file__).resolve().parents[2]
RUN = [sys.executable, "-m", "otel_gpu", "run"]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("Uid:")))
    except OSError:
        return None


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="a command that changes its uid needs root and setpriv (util-linux)")
def test_a_command_that_changed_its_uid_ends_when_run_is_killed():
    marker = f"{300 + random.random():.6f}"
    run = subprocess.Popen(RUN + ["--no-record", "--", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                  "sleep", marker], env=clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"),
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sleeper = []
    try:
        sleeper = wait_until(lambda: [p for p in pids_with(f"sleep {marker}") if p != run.pid and _uid(p) == 65534], 60)
        assert sleeper
        time.sleep(tree_guard.POLL_S * 2)   # the guard has noted it
        run.kill()
        run.wait()
        assert wait_until(lambda: not any(map(alive, sleeper)), tree_guard.GRACE_S + 3), "the command lived on"
    finally:
        run.kill()
        run.wait()
        _kill(p for p in sleeper if alive(p))


def test_the_agent_goes_at_once_when_run_is_killed(tmp_path):
    marker = f"{300 + random.random():.6f}"
    run = subprocess.Popen(RUN + ["--record", str(tmp_path / "rec"), "--no-report", "--no-profile", "--agent-arg=--no-gpu",
                                  "--", "sleep", marker], env=clean_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    agent = []
    try:
        agent = wait_until(lambda: pids_with(f"--parent-pid={run.pid}"), 60)
        assert agent
        wait_until(lambda: "sampling every" in (tmp_path / "rec" / "agent.log").read_text(), 60)
        run.kill()
        t0 = time.monotonic()
        run.wait()
        assert wait_until(lambda: not any(map(alive, agent)), 5, poll_s=0.01)
        took = time.monotonic() - t0
        assert took < 3.0, f"the agent took {took:.2f} s"   # ~20 ms alone; 2.02 s once under the whole suite on 2 cores
    finally:
        run.kill()
        run.wait()
        _kill(p for p in agent + pids_with(f"sleep {marker}") if alive(p) and p != run.pid)


def _tree() -> subprocess.Popen:
    """A process with two children of its own (the stand-in for run's command and agent)."""
    return subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"])


@pytest.mark.parametrize("done", [False, True], ids=["run-killed", "run-done"])
def test_the_guard_ends_the_noted_tree_unless_run_said_it_is_done(done):
    root = _tree()
    read, write = os.pipe()
    got, kids = [], []
    watcher = threading.Thread(target=lambda: got.append(tree_guard.watch(root.pid, read)))
    try:
        kids = wait_until(lambda: [p.pid for p in children.descendants(root.pid, children.read_table())
                                   if len(children.descendants(root.pid, children.read_table())) == 2], 10)
        watcher.start()
        time.sleep(tree_guard.POLL_S * 2)
        if done:
            os.write(write, tree_guard.DONE)
        os.close(write)
        watcher.join(tree_guard.GRACE_S + 5)
        assert got == [0 if done else 2]
        assert any(map(alive, kids)) == done
    finally:
        os.close(read)
        root.kill()
        root.wait()
        _kill(p for p in kids if alive(p))
