"""What a recorded run decides from its flags and environment (pure parts, property-based) and the
`run` flags' bad-input handling."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.errors import UsageError
from otel_gpu.record import session as S
from tests.childenv import clean_env

REPO = Path(__file__).resolve().parents[2]
URL = st.sampled_from(["", "http://c:4318", "https://c:4318/", "collector:4318"])


@settings(max_examples=60, deadline=None)
@given(otlp=URL, metrics=URL, pyro_env=URL, pyro_flag=st.sampled_from([None, "http://p:4040"]))
def test_recording_is_the_default_only_without_an_otlp_endpoint(otlp, metrics, pyro_env, pyro_flag):
    """A Pyroscope server alone does not turn recording off: the metrics would have nowhere to go."""
    env = {k: v for k, v in {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": metrics,
                             "OTELGPU_PYROSCOPE_URL": pyro_env}.items()}
    assert S.wants_recording(env, pyro_flag) == (not (otlp or metrics))


@settings(max_examples=60, deadline=None)
@given(otlp=URL, metrics=URL, protocol=st.sampled_from([None, "http/protobuf", "grpc", "bogus"]))
def test_forward_url_follows_the_otlp_variables(otlp, metrics, protocol):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": metrics}
    if protocol:
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = protocol
    if not (otlp or metrics):
        assert S.metrics_forward_url(env) is None
        return
    want = metrics or otlp.rstrip("/") + "/v1/metrics"
    if protocol not in (None, "http/protobuf") or not want.startswith("http"):
        with pytest.raises(UsageError):
            S.metrics_forward_url(env)
    else:
        assert S.metrics_forward_url(env) == want


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.text(alphabet="abc/ .-_xyzp", min_size=1, max_size=15), min_size=1, max_size=5),
       job=st.sampled_from([None, "my-job"]))
def test_job_name_is_the_configured_one_or_a_safe_name_from_the_script(words, job):
    env = {"OTELGPU_JOB": job} if job else {}
    name = S.default_job(env, words)
    if job:
        assert name == job
    else:
        assert name and "/" not in name and " " not in name


def test_job_name_from_the_training_script():
    assert S.default_job({}, ["torchrun", "--nproc_per_node", "2", "train/my_train.py", "--lr", "1"]) == "my_train"
    assert S.default_job({}, ["sh", "-c", "python x/y.py 3"]) == "y"
    assert S.default_job({"TORCHELASTIC_RUN_ID": "abc"}, ["python", "t.py"]) == "abc"


def test_run_dirs_never_collide(tmp_path):
    a = S.run_dir(tmp_path, "j", 1_700_000_000.0)
    a.mkdir(parents=True)
    b = S.run_dir(tmp_path, "j", 1_700_000_000.0)
    assert a.name == "j-20231114T221320Z" and b != a and b.name.startswith(a.name)


def test_the_command_env_points_every_exporter_at_the_receiver(tmp_path):
    rec = S.RecordedRun(tmp_path / "r", "j", ["true"], {})
    try:
        env = rec.child_env({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c/v1/metrics", "OTEL_METRIC_EXPORT_INTERVAL": "500"})
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == rec.receiver.url and "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT" not in env
        assert env["OTELGPU_PYROSCOPE_URL"] == rec.receiver.url and env["OTELGPU_JOB"] == "j"
        assert env["OTEL_METRIC_EXPORT_INTERVAL"] == "500"          # the user's interval wins
        assert "OTELGPU_PYROSCOPE_URL" not in rec.child_env({"OTELGPU_PROFILE": "0"})
        assert rec.receiver.url.startswith("http://127.0.0.1:")
    finally:
        rec.finish(0)


RUN = [sys.executable, "-m", "otel_gpu", "run"]


@pytest.mark.parametrize("args, message", [
    (["--record", "x", "--no-record", "--", "true"], "either --record or --no-record"),
    (["--record", "/proc/no-such-dir/run", "--", "true"], "cannot write the recording"),
])
def test_bad_record_flags_are_one_line_and_exit_2(args, message, tmp_path):
    proc = subprocess.run(RUN + args, env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr
    assert not (tmp_path / "x").exists()


def test_grpc_with_record_is_refused(tmp_path):
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    proc = subprocess.run(RUN + ["--record", str(tmp_path / "r"), "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "http/protobuf" in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["diagnose"], "either RUN_DIR"),
    (["diagnose", "somedir", "--prometheus", "http://127.0.0.1:9"], "either RUN_DIR"),
    (["diagnose", "somedir", "--last", "1h"], "whole recording"),
    (["diagnose", "somedir", "--job", "j"], "whole recording"),
    (["report", "no-such-dir"], "no such directory"),
])
def test_recording_readers_refuse_bad_arguments_in_one_line(args, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "otel_gpu", *args], env=clean_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and "Traceback" not in proc.stderr
