"""`otel-gpu run` and the other commands with what a shell can hand them: a closed stdout (`>&-`),
a command that is not there or cannot be run. The exit status is the one a shell gives."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.childenv import clean_env

REPO = Path(__file__).resolve().parents[2]
OTEL_GPU = [sys.executable, "-m", "otel_gpu"]


def _closed_stdout(args: list[str], **kw) -> subprocess.CompletedProcess:
    """`args` run with its standard output closed, as `cmd >&-` in a shell does."""
    return subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *args], env={**clean_env(), "PYTHONPATH": str(REPO)},
                          cwd=REPO, capture_output=True, text=True, timeout=120, **kw)


def test_run_with_stdout_closed_keeps_the_commands_exit_status():
    proc = _closed_stdout(OTEL_GPU + ["run", "--no-record", "--", "sh", "-c", "exit 4"])
    assert proc.returncode == 4, proc.stderr
    assert "internal error" not in proc.stderr


def test_a_recording_made_with_stdout_closed_is_whole(tmp_path):
    """No file `run` opens takes the closed descriptor (the command's output once went into it)."""
    rec = tmp_path / "rec"
    proc = _closed_stdout(OTEL_GPU + ["run", "--record", str(rec), "--no-agent", "--no-report", "--", "sh", "-c",
                                      "echo hello from the command; exit 4"])
    assert proc.returncode == 4, proc.stderr
    with sqlite3.connect(rec / "recording.sqlite") as db:
        assert dict(db.execute("SELECT key, value FROM meta"))["exit_status"] == "4"
    report = _closed_stdout(OTEL_GPU + ["report", str(rec), "-o", str(tmp_path / "r.html")])
    assert report.returncode == 0 and "internal error" not in report.stderr, report.stderr


@pytest.mark.parametrize("command, status, says", [
    ("/nonexistent/cmd", 127, "no such file"), ("no-such-command-xyz", 127, "command not found"),
    ("/tmp", 126, "is a folder"), ("{plain}", 126, "not executable"),
])
def test_a_command_that_cannot_run_exits_as_a_shell_would(tmp_path, command, status, says):
    plain = tmp_path / "plain.sh"
    plain.write_text("exit 0\n")
    plain.chmod(0o644)
    command = command.format(plain=plain)
    proc = subprocess.run(OTEL_GPU + ["run", "--no-record", "--", command], env=clean_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    shell = subprocess.run(["sh", "-c", '"$0"', command], capture_output=True)
    assert proc.returncode == shell.returncode == status
    assert says in proc.stderr and proc.stderr.strip().count("\n") == 0
