"""A trial leaves nothing behind, even processes that left its process group: `setsid` daemons,
double forks, ones that ignore SIGTERM; through the trial runner and through a whole (tiny) study."""
import os
import signal
import sys
import time

import pytest

from otel_gpu.tune import trial as T
from otel_gpu.tune.objective import LogObjective
from otel_gpu.tune.space import parse_space
from otel_gpu.tune.study import Settings, Tuner, storage_url
from otel_gpu.tune import config as C

from .helpers import clean_env, copy_base, fake_command

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreaper and /proc are Linux's")

DOUBLE_FORK = ("python3 -c 'import os, sys, time\n"
               "if os.fork(): sys.exit(0)\n"
               "os.setsid()\n"
               "if os.fork(): sys.exit(0)\n"
               "open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(1000)' {pidfile}")


def _plan(tmp_path, command, timeout=20.0, grace=1.0):
    return T.TrialPlan(1, "s-1", tmp_path / "t", command, clean_env(), timeout, grace)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not T._zombie(pid)


def _pid(path, timeout_s=20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip().isdigit()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(path.read_text())


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("daemon", [
    "setsid sleep 1000 >/dev/null 2>&1 & echo $! > {pidfile}",
    DOUBLE_FORK,
])
@pytest.mark.parametrize("ending", ["exits 0", "crashes", "times out"])
def test_a_daemonized_process_does_not_outlive_its_trial(tmp_path, daemon, ending):
    pidfile = tmp_path / "daemon.pid"
    tail = {"exits 0": "exit 0", "crashes": "exit 3", "times out": "sleep 300"}[ending]
    run = T.run_trial(_plan(tmp_path, f"{daemon.format(pidfile=pidfile)}; while [ ! -s {pidfile} ]; do sleep 0.05; done; "
                                      f"{tail}", timeout=3.0))
    pid = _pid(pidfile)
    try:
        assert run.status == {"exits 0": T.OK, "crashes": T.CRASH, "times out": T.TIMEOUT}[ending], run.reason
        assert not _alive(pid), f"pid {pid} outlived its trial"
        assert run.seconds < 12
    finally:
        _kill(pid)


def test_a_daemon_that_ignores_sigterm_is_sigkilled_after_the_grace_period(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    stubborn = tmp_path / "stubborn.sh"
    stubborn.write_text(f"trap '' TERM; echo $$ > {pidfile}; while :; do sleep 0.1; done\n")
    run = T.run_trial(_plan(tmp_path, f"setsid /bin/sh {stubborn} >/dev/null 2>&1 & "
                                      f"while [ ! -s {pidfile} ]; do sleep 0.05; done; exit 0", grace=0.5))
    pid = _pid(pidfile)
    try:
        assert run.status == T.OK and not _alive(pid)
        assert run.seconds < 10
    finally:
        _kill(pid)


def test_a_study_whose_command_daemonizes_leaves_no_process(tmp_path):
    pidfile = tmp_path / "daemons.pid"
    base = copy_base(tmp_path)
    cmd = f"setsid sleep 1000 >/dev/null 2>&1 & echo $! >> {pidfile}; " + fake_command()
    out = tmp_path / "out"
    s = Settings(base_config=base, command=cmd, trials=2, out=out, storage=storage_url(out / "study.db"),
                 study_name="t", space=parse_space({}), seed=1, deepspeed_check=False, timeout_s=30.0, grace_s=1.0,
                 prune=False, instrument=False,
                 facts=C.Facts(hidden_size=64, micro_batch=4, grad_accum=1, world_size=2, max_grad_norm=1.0,
                               precision="fp32"))
    tuner = Tuner(s, LogObjective(warmup=2), env=clean_env())
    tuner.prepare()
    records = tuner.run()
    pids = [int(line) for line in pidfile.read_text().split()]
    try:
        assert [r.status for r in records] == ["ok", "ok"] and len(pids) == 2
        assert [p for p in pids if _alive(p)] == []
    finally:
        for p in pids:
            _kill(p)
