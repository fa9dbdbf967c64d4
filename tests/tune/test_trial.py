"""The trial runner: placeholders, environment, process-group kill on timeout, classification."""
import os
import signal
import time
from pathlib import Path

import pytest

from otel_gpu.run_cli import SITE_DIR
from otel_gpu.tune import trial as T


def _plan(tmp_path, command, timeout=10.0, grace=1.0, env=None):
    return T.TrialPlan(1, "s-1", tmp_path / "t", command, env or dict(os.environ), timeout, grace)


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return T._zombie(pid)


def test_render_command_quotes_paths():
    cmd = T.render_command("torchrun x.py --deepspeed {config} --out {trial_dir}/o --seed {trial} --tag {trial_id}",
                           Path("/tmp/my dir/c.json"), Path("/tmp/my dir"), 7, "study-7")
    assert cmd == "torchrun x.py --deepspeed '/tmp/my dir/c.json' --out '/tmp/my dir'/o --seed 7 --tag study-7"


def test_check_template():
    assert "must contain {config}" in T.check_template("torchrun train.py")
    assert "not valid shell syntax" in T.check_template("run --deepspeed {config} 'unclosed")
    assert T.check_template("run --deepspeed {config}") is None


def test_trial_env_tags_metrics_and_keeps_user_attributes():
    env = T.trial_env({"OTEL_RESOURCE_ATTRIBUTES": "team=ml,otelgpu.trial=old", "PYTHONPATH": "/x"}, "s-3",
                      otlp_endpoint="http://127.0.0.1:1/otlp")
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "team=ml,otelgpu.trial=s-3"
    assert env["OTELGPU_TRIAL"] == "s-3" and env["OTEL_METRIC_EXPORT_INTERVAL"] == "1000"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:1/otlp"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(SITE_DIR) and "/x" in env["PYTHONPATH"]
    plain = T.trial_env({"OTEL_METRIC_EXPORT_INTERVAL": "5000"}, "s-4", instrument=False)
    assert plain["OTEL_METRIC_EXPORT_INTERVAL"] == "5000" and "PYTHONPATH" not in plain


@pytest.mark.parametrize("rc, tail, status, reason", [
    (0, "", T.OK, "exited 0"),
    (1, "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", T.OOM,
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    (1, "pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig\n", T.REJECTED,
     "pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig"),
    (1, "[rank1]: RuntimeError: boom\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: x\n",
     T.CRASH, "exit status 1: RuntimeError: boom"),
    (-signal.SIGKILL, "", T.OOM, "killed by SIGKILL without being asked (most often the kernel's OOM killer)"),
    (-signal.SIGSEGV, "", T.CRASH, "killed by signal SIGSEGV"),
    (3, "no traceback here", T.CRASH, "exit status 3"),
])
def test_classify(rc, tail, status, reason):
    assert T.classify(rc, tail) == (status, reason)


def test_classify_timeout_and_pruned_win():
    assert T.classify(-15, "", timed_out=True, timeout_s=5)[0] == T.TIMEOUT
    assert T.classify(-15, "", stop_reason="slow") == (T.PRUNED, "slow")


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    # the shell starts a background grandchild, then hangs; both must be gone after the timeout
    run = T.run_trial(_plan(tmp_path, f"sleep 300 & echo $! > {pidfile}; echo started; sleep 300", timeout=1.5))
    assert run.status == T.TIMEOUT and "1.5 s trial timeout" in run.reason
    assert 1.4 < run.seconds < 5
    assert _dead(int(pidfile.read_text())) and not T.group_alive(run.pgid)
    assert "started" in (tmp_path / "t" / T.LOG_NAME).read_text()


def test_sigterm_ignored_gets_sigkill_after_grace(tmp_path):
    run = T.run_trial(_plan(tmp_path, "trap '' TERM; echo ready; while true; do sleep 0.1; done", timeout=1, grace=0.5))
    assert run.status == T.TIMEOUT and not T.group_alive(run.pgid)
    assert run.seconds < 4


def test_stragglers_of_a_finished_trial_are_killed(tmp_path):
    pidfile = tmp_path / "child.pid"
    run = T.run_trial(_plan(tmp_path, f"sleep 300 & echo $! > {pidfile}; exit 0"))
    assert run.status == T.OK and _dead(int(pidfile.read_text()))


def test_monitor_prunes_and_exit_codes_are_classified(tmp_path):
    calls = []

    def monitor():
        calls.append(time.monotonic())
        return "too slow" if len(calls) >= 2 else None

    run = T.run_trial(_plan(tmp_path, "sleep 30"), monitor, poll_s=0.1)
    assert (run.status, run.reason) == (T.PRUNED, "too slow") and not T.group_alive(run.pgid)
    crash = T.run_trial(_plan(tmp_path, "python3 -c 'raise ValueError(\"bad value\")'"))
    assert crash.status == T.CRASH and crash.reason == "exit status 1: ValueError: bad value"


def test_interrupt_kills_the_group_and_propagates(tmp_path):
    pidfile = tmp_path / "child.pid"

    def monitor():
        if pidfile.exists() and pidfile.read_text().strip():
            raise KeyboardInterrupt
        return None

    with pytest.raises(KeyboardInterrupt):
        T.run_trial(_plan(tmp_path, f"sleep 300 & echo $! > {pidfile}; sleep 300"), monitor, poll_s=0.05)
    assert _dead(int(pidfile.read_text()))


def test_start_time_tells_reused_pids_apart():
    assert T.start_time(os.getpid()) == T.start_time(os.getpid()) is not None
    assert T.start_time(2**22 + 12345) is None


def test_a_group_whose_leader_is_gone_is_still_known_by_its_members_trial_id():
    """The tuner's death signal ends the /bin/sh wrapper while the ranks run on: a resume must still
    recognise (and kill) the group by the trial id in its members' environment, and nothing else."""
    import subprocess
    import sys

    env = {**os.environ, T.TRIAL_ENV: "t-7"}
    leader = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' & echo started"],
                              env=env, start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        assert leader.stdout.readline().strip() == "started"
        pgid, start = leader.pid, T.start_time(leader.pid)
        assert T.group_is_trial(pgid, start, "t-7") and not T.group_is_trial(pgid, start + 1, "t-7")
        leader.wait(timeout=10)                           # reaped: the pid no longer names a process
        assert T.start_time(pgid) is None and T.group_alive(pgid)
        assert T.group_is_trial(pgid, start, "t-7")
        assert not T.group_is_trial(pgid, start, "t-8") and not T.group_is_trial(pgid, start, None)
    finally:
        T.kill_group(leader.pid, 2.0)
    assert not T.group_alive(pgid) and not T.group_is_trial(pgid, start, "t-7")
