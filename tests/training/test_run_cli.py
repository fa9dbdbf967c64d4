"""`otel-gpu run`: zero code change, exit status passed through, bad input in one line."""
import subprocess
import sys
import time

import httpx
import pytest

from conftest import HERE, REPO, clean_env, otlp_env, query_until, unique_job
from servers import free_port

from otel_gpu import run_cli

RUN = [sys.executable, "-c", "import sys; from otel_gpu.cli import main; sys.exit(main())", "run"]


def _run(args, env, timeout=120):
    return subprocess.run(RUN + args, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def assert_untouched_loop_reported(vm, job: str, proc, status: int) -> None:
    """untouched_loop.py ran 20 optimizer steps and exited with `status`: 19 steps counted (the
    first optimizer.step() only opens the count); its model call, backward and optimizer calls are phases."""
    assert proc.returncode == status, proc.stderr
    assert "finished" in proc.stdout
    sel = f'otelgpu_job="{job}"'
    assert query_until(vm, f"otelgpu_train_steps_total{{{sel}}}", 1)[0].value == 19
    phases = query_until(vm, f"otelgpu_train_phase_time_seconds_total{{{sel}}}", 1)
    assert sorted(s.labels["otelgpu_phase"] for s in phases) == ["backward", "forward", "optimizer"]


@pytest.mark.slow
def test_untouched_torch_loop_reports_steps_and_keeps_its_exit_status(victoriametrics, torch_mod):
    vm, job = victoriametrics, unique_job("untouched")
    proc = _run(["--job", job, "--", sys.executable, str(HERE / "untouched_loop.py"), "20", "7"], otlp_env(vm, "x"))
    assert_untouched_loop_reported(vm, job, proc, 7)


@pytest.mark.slow
def test_opentelemetry_instrument_works_through_the_instrumentor_entry_point(victoriametrics, torch_mod):
    """`opentelemetry-instrument python train.py`: the same untouched loop, the same steps."""
    import shutil

    launcher = shutil.which("opentelemetry-instrument")
    if launcher is None:
        pytest.skip("opentelemetry-instrument not installed (extra 'instrument'; .ci/install.sh installs it)")
    vm, job = victoriametrics, unique_job("otel-instrument")
    proc = subprocess.run([launcher, sys.executable, str(HERE / "untouched_loop.py"), "20", "5"],
                          env=otlp_env(vm, job), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert_untouched_loop_reported(vm, job, proc, 5)


def test_exit_status_of_a_signalled_command_is_128_plus_signal():
    proc = _run(["--no-profile", "--", "sh", "-c", "kill -TERM $$"], clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"))
    assert proc.returncode == 143


@pytest.mark.parametrize("args, message", [
    ([], "no command given"),
    (["--pyroscope", "pyroscope:4040", "--", "true"], "expected a URL"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = _run(args, clean_env())
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr


def test_child_env_puts_the_sitecustomize_first_and_keeps_user_settings():
    env = run_cli.child_env({"PYTHONPATH": "/mine", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
                            pyroscope="http://p:4040", no_profile=False, job="j")
    paths = env["PYTHONPATH"].split(":")
    assert paths[0] == str(run_cli.SITE_DIR) and paths[-1] == "/mine"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
    assert (env["OTELGPU_PYROSCOPE_URL"], env["OTELGPU_JOB"]) == ("http://p:4040", "j")
    bare = run_cli.child_env({}, no_profile=True)
    assert bare["OTEL_EXPORTER_OTLP_ENDPOINT"] == run_cli.DEFAULT_OTLP and bare["OTELGPU_PROFILE"] == "0"


def test_the_hidden_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.USER_SITE_RAN = True\n")
    code = ("import sys, builtins; from otel_gpu.training import auto; "
            "print(getattr(builtins, 'USER_SITE_RAN', False), auto._finder in sys.meta_path)")
    proc = _run(["--no-profile", "--", sys.executable, "-c", code], clean_env(PYTHONPATH=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]


@pytest.mark.slow
def test_agent_runs_for_the_lifetime_of_the_command():
    port = free_port()
    probe = (f"import httpx, time\n"
             f"for _ in range(150):\n"
             f"    try:\n"
             f"        r = httpx.get('http://127.0.0.1:{port}/metrics', timeout=1); print(r.status_code); break\n"
             f"    except httpx.HTTPError: time.sleep(0.1)\n")
    proc = _run(["--no-profile", "--agent", "--agent-arg=--no-gpu", f"--agent-arg=--prometheus-port={port}", "--",
                 sys.executable, "-c", probe], clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "200"
    time.sleep(0.2)
    with pytest.raises(httpx.HTTPError):   # stopped with the command
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)


@pytest.mark.slow
def test_agent_and_ranks_share_identity_and_join_in_promql(victoriametrics, torch_mod):
    """`run --agent`: the node agent's series and the rank's join on host and job in PromQL."""
    vm, job = victoriametrics, unique_job("join")
    proc = _run(["--job", job, "--no-profile", "--agent", "--agent-arg=--no-gpu", "--",
                 sys.executable, str(HERE / "untouched_loop.py"), "20", "0"], otlp_env(vm, "x"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    sel = f'otelgpu_job="{job}"'
    node = query_until(vm, f"system_memory_limit_bytes{{{sel}}}", 1)
    rank = query_until(vm, f"otelgpu_train_steps_total{{{sel}}}", 1)
    assert node and rank
    assert node[0].labels["service_instance_id"] == rank[0].labels["service_instance_id"]
    joined = query_until(vm, f"otelgpu_train_steps_total{{{sel}}} * on (host_name, otelgpu_job) "
                             f"(system_memory_limit_bytes{{{sel}}} > bool 0)", 1)
    assert [s.value for s in joined] == [19]
