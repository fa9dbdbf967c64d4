"""One exit-status convention for every subcommand, as a user meets it (real subprocesses):
2 bad input (flags, environment, input files), 1 runtime failure, 141 stdout closed by its
reader; always one line on stderr, never a traceback, never a half-written output."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.childenv import clean_env

CLI = [sys.executable, "-m", "otel_gpu"]


def otel_gpu(args, env=None, timeout=120, cwd=None):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=clean_env(**(env or {})))


def assert_one_line(proc, status: int, message: str) -> None:
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    assert message in err, err


@pytest.mark.parametrize("env, message", [
    ({"OTEL_METRIC_EXPORT_INTERVAL": "nan"}, "OTEL_METRIC_EXPORT_INTERVAL='nan': must be a finite number"),
    ({"OTEL_METRIC_EXPORT_INTERVAL": "inf"}, "OTEL_METRIC_EXPORT_INTERVAL='inf': must be a finite number"),
    ({"OTEL_METRIC_EXPORT_INTERVAL": "1e300"}, "must be between 10 and 8.64e+07"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "nan"}, "OTEL_EXPORTER_OTLP_TIMEOUT='nan': must be a finite number"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://"}, "OTEL_EXPORTER_OTLP_ENDPOINT='http://': the URL has no host"),
    ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:99999"}, "not a valid URL"),
    ({"OTELGPU_INTERVAL": "inf"}, "--interval='inf': must be a finite number"),
    ({"OTELGPU_FAKE_GPUS": "1e3"}, "--fake-gpus='1e3': expected an integer"),
])
def test_agent_environment_is_validated_at_the_edge(env, message):
    assert_one_line(otel_gpu(["agent", "--no-live", "--no-gpu"], env), 2, message)


@pytest.mark.parametrize("args, message", [
    (["agent", "--interval", "nan"], "--interval='nan': must be a finite number"),
    (["agent", "--prometheus-port", "1e3"], "expected an integer"),
    (["agent", "--bogus"], "unrecognized arguments: --bogus"),
    (["tune", "--base-config", "x.json", "--trial-timeout", "nan"], "argument --trial-timeout: 'nan'"),
    (["tune", "--base-config", "x.json", "--poll=-inf"], "argument --poll: '-inf'"),
    (["tune", "--base-config", "x.json", "--trials", "1.5"], "argument --trials: '1.5': expected an integer"),
    (["diagnose", "--prometheus", "http://127.0.0.1:9", "--from", "nan"], "time 'nan'"),
    (["diagnose", "--prometheus", "http://127.0.0.1:9", "--from", "1e400"], "outside 1970 to the year 3000"),
    (["diagnose", "--prometheus", "http://127.0.0.1:9", "--last", "9" * 400], "longer than a century"),
    (["run", "--pyroscope", "http://", "--", "true"], "argument --pyroscope: 'http://': the URL has no host"),
    (["run", "--job", "a\nb", "--", "true"], "argument --job"),
    (["run", "--agent", "--agent-arg=--interval=nan", "--", "true"], "--interval='nan': must be a finite number"),
    (["run", "--agent", "--agent-arg=--bogus", "--", "true"], "--agent-arg: unrecognized arguments: --bogus"),
])
def test_bad_flags_are_one_line_and_exit_2(args, message):
    assert_one_line(otel_gpu(args), 2, message)


def test_a_space_file_whose_params_is_a_list_is_exit_2_and_writes_nothing(tmp_path):
    base = tmp_path / "ds.json"
    base.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  - reduce_bucket_size\n")
    out = tmp_path / "out"
    proc = otel_gpu(["tune", "--base-config", str(base), "--command", "x {config}", "--space", str(space),
                     "--out", str(out)])
    assert_one_line(proc, 2, "'params' must be a mapping")
    assert not out.exists()


def test_dashboards_out_that_is_a_file_is_exit_2(tmp_path):
    target = tmp_path / "file"
    target.write_text("keep me")
    assert_one_line(otel_gpu(["dashboards", "--out", str(target)]), 2, "not a folder")
    assert target.read_text() == "keep me"


def test_a_server_that_is_down_is_a_runtime_failure_exit_1():
    proc = otel_gpu(["diagnose", "--prometheus", "http://127.0.0.1:9", "--last", "1h"])
    assert_one_line(proc, 1, "unreachable")


def test_stdout_closed_by_its_reader_is_a_quiet_exit_141():
    """`otel-gpu agent --once --json | head -c0`: the reader is gone before the snapshot is written."""
    proc = subprocess.Popen(CLI + ["agent", "--once", "--json", "--no-gpu"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env())
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err
    assert err.decode().strip() == "otel-gpu agent: GPU metrics are off: disabled by --no-gpu"   # nothing more


def test_in_a_shell_pipeline_to_head(tmp_path):
    done = subprocess.run(" ".join(CLI) + " agent --once --json --no-gpu | head -c 1; echo \" ${PIPESTATUS[0]}\"",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, env=clean_env(),
                          timeout=60)
    assert done.stdout in ("[ 141\n", "[ 0\n"), done.stdout   # 0 when the snapshot fit the pipe in one write
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_help_and_version_exit_0():
    assert otel_gpu(["--version"]).returncode == 0
    assert otel_gpu(["tune", "--help"]).returncode == 0
