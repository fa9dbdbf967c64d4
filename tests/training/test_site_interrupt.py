"""Ctrl-C while our sitecustomize runs (the first ~0.5 s of every Python process of a run) ends the
process as Python ends on Ctrl-C, by SIGINT (130 through `otel-gpu run`); it was "Fatal Python
error: init_import_site" and exit 1. A slow sitecustomize of the user's, which ours runs, holds the
process there long enough to be interrupted for certain."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from otel_gpu.run_cli import SITE_DIR
from tests.childenv import clean_env

REPO = Path(__file__).resolve().parents[2]


def _slow_site(tmp_path: Path) -> Path:
    # slow only where ours ran first (`otel-gpu run` itself, which also sees it, starts as usual)
    (tmp_path / "sitecustomize.py").write_text("import sys, time\nif 'otel_gpu.training' in sys.modules:\n"
                                               "    print('in sitecustomize', flush=True)\n    time.sleep(30)\n")
    return tmp_path


def _default_sigint() -> None:
    """The child starts with Ctrl-C's default action, as a terminal's command does: a test session run in
    the background (`cmd &` without job control) hands its children SIGINT ignored, which Python keeps."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(cmd: list[str], env: dict, target=lambda p: p.pid) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    try:
        assert proc.stdout.readline().strip() == "in sitecustomize"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_ctrl_c_during_sitecustomize_is_a_sigint_exit(tmp_path):
    env = {**clean_env(), "PYTHONPATH": f"{SITE_DIR}:{REPO}:{_slow_site(tmp_path)}", "OTELGPU_TRAINING": "1"}
    got = _interrupt([sys.executable, "-c", "print('main ran')"], env)
    assert got.returncode == -signal.SIGINT, got.stderr
    assert "Fatal Python error" not in got.stderr and "main ran" not in got.stdout


def test_ctrl_c_during_a_runs_start_exits_130(tmp_path):
    env = {**clean_env(), "PYTHONPATH": str(_slow_site(tmp_path)), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    got = _interrupt([sys.executable, "-m", "otel_gpu", "run", "--no-record", "--no-profile", "--", sys.executable,
                      "-c", "print('main ran')"], env)
    assert got.returncode == 130, got.stderr
    assert "Fatal Python error" not in got.stderr
