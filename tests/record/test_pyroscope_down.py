"""`otel-gpu run --pyroscope URL` with nothing listening there: the run is still recorded (no OTLP
endpoint is configured, so the metrics have nowhere else to go), its summary is printed, and one line
says the profiles were not sent to Pyroscope and why; the profiles are in the recording. (It recorded
nothing before, printed no summary and one raw line of the OpenTelemetry SDK.)"""
from __future__ import annotations

import subprocess
import sys

import pytest

from otel_gpu import names as N
from otel_gpu.record.reader import Recording
from tests.childenv import clean_env
from tests.servers import free_port

from .conftest import RUN

pytestmark = pytest.mark.slow
JOB = """import time
from otel_gpu import training
for i in range(50):
    with training.step():
        time.sleep(0.1)
"""


def test_an_unreachable_pyroscope_is_one_line_and_the_run_is_recorded(tmp_path):
    pytest.importorskip("pyroscope", reason="pyroscope-io not installed (pip install 'otel-gpu[profile]')")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    port = free_port()
    env = {k: v for k, v in clean_env().items() if not k.startswith(("OTEL_EXPORTER_OTLP", "OTELGPU_PYROSCOPE"))}
    done = subprocess.run(RUN + ["--pyroscope", f"http://127.0.0.1:{port}", "--no-live", "--", sys.executable,
                                 str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    assert "Transient error" not in err and "Traceback" not in err, err
    notes = [x for x in err.splitlines() if "Pyroscope" in x]
    assert notes == [f"otel-gpu run: profiles were not sent to Pyroscope at http://127.0.0.1:{port} "
                     "(connection refused); they are in the recording"], err
    assert "otel-gpu: job job" in err and "rank 0: 50 steps" in err and "otel-gpu: report " in err, err
    (run_dir,) = (tmp_path / "otel-gpu-runs").iterdir()
    with Recording.open([run_dir]) as rec:
        assert rec.summaries(N.TRAIN_STEPS.name), "no step metrics recorded"
        assert rec.profile_count() > 0, "no profile recorded"


def test_not_recording_an_unreachable_pyroscope_is_said_before_the_command_starts(tmp_path):
    """With a collector configured the run is not recorded and the ranks push their profiles themselves
    (silently): the run says at its start that they will not arrive."""
    port = free_port()
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    done = subprocess.run(RUN + ["--pyroscope", f"http://127.0.0.1:{port}", "--", sys.executable, "-c", "print('ran')"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr[-2000:]
    assert done.stderr.splitlines()[0] == (f"otel-gpu run: Pyroscope at http://127.0.0.1:{port} is not reachable "
                                           "(connection refused): profiles will not be sent"), done.stderr
    assert not (tmp_path / "otel-gpu-runs").exists()
