"""`diagnose --watch` as a process: flags, a backend that goes away and comes back, signals."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.cli import main
from tests.childenv import clean_env
from tests.servers import VictoriaMetrics, free_port, require_binary, VICTORIA_METRICS_BIN

WATCH = [sys.executable, "-m", "otel_gpu", "diagnose", "--watch"]


def _usage(capsys, *argv: str) -> str:
    code = main(["diagnose", *argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv, says", [
    (["--watch", "--prometheus", "http://127.0.0.1:9", "--from", "now-1h"], "--last"),
    (["--watch", "--prometheus", "http://127.0.0.1:9", "--markdown", "-"], "--markdown"),
    (["--watch", "--prometheus", "http://127.0.0.1:9", "--every", "0.1s"], "--every"),
    (["--watch", "--prometheus", "http://127.0.0.1:9", "--hold", "30d"], "--hold"),
    (["--watch", "--prometheus", "http://127.0.0.1:9", "--every", "soon"], "duration"),
    (["--watch", "--prometheus", "http://127.0.0.1:9", "--min-severity", "loud"], "min-severity"),
    (["--watch", "--prometheus", "http://127.0.0.1:9", "--grafana", "http://127.0.0.1:9"], "token"),
])
def test_bad_flags_are_one_line_and_exit_2(capsys, monkeypatch, argv, says):
    monkeypatch.delenv("OTELGPU_GRAFANA_TOKEN", raising=False)
    try:
        err = _usage(capsys, *argv)
    except SystemExit as exc:   # argparse's own refusal (a choice): exit 2, its message on stderr
        assert exc.code == 2
        err = capsys.readouterr().err
    assert says in err


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=12))
def test_any_every_value_is_accepted_or_refused_in_one_line(text):
    from otel_gpu.diagnose.watch_cli import _durations
    from otel_gpu.errors import UsageError

    class Args:
        every, hold, last = text, "60s", None
    try:
        every, _, _ = _durations(Args)
    except UsageError as exc:
        assert "\n" not in str(exc)
    else:
        assert 0.5 <= every <= 3600


def test_a_backend_that_goes_away_and_comes_back_is_said_once_each(tmp_path):
    require_binary(VICTORIA_METRICS_BIN, "VictoriaMetrics (bash .ci/install.sh)")
    port = free_port()
    proc = subprocess.Popen([*WATCH, "--prometheus", f"http://127.0.0.1:{port}", "--every", "0.5s", "--timeout", "2"],
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    vm = VictoriaMetrics(tmp_path, port=port)
    try:
        time.sleep(4)            # down: said once, however many evaluations fail
        vm.start()
        time.sleep(4)            # up, but no job has reported yet: waiting, not an error
        vm.stop()
        time.sleep(4)            # down again
    finally:
        vm.stop()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines = err.strip().splitlines()
    kinds = ["down" if "cannot read" in line else "waiting" if "waiting for data" in line else line for line in lines]
    assert kinds == ["down", "waiting", "down"], lines
    assert out == ""
