"""`otel-gpu trace capture` when it cannot capture: no ranks registered (2), none running (1), a running
rank that never answers (1 after --timeout); each one line naming why."""
from __future__ import annotations

import json
import os

from otel_gpu.cli import main
from otel_gpu.stacks import start_ticks
from otel_gpu.trace import capture_files as cf


def _register(root, pid: int, ticks: int) -> None:
    (root / cf.RANKS).mkdir(parents=True, exist_ok=True)
    doc = {"rank": "0", "pid": pid, "start_ticks": ticks, "time": 1.0, "step": 3, "state": cf.IDLE}
    (root / cf.RANKS / f"rank0-pid{pid}.json").write_text(json.dumps(doc))


def test_a_folder_without_ranks_is_exit_2(tmp_path, capsys):
    assert main(["trace", "capture", str(tmp_path), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no ranks registered" in err


def test_ranks_that_are_gone_are_exit_1(tmp_path, capsys):
    _register(tmp_path / "traces", os.getpid(), 1)   # this PID, another start time: a process that ended
    assert main(["trace", "capture", str(tmp_path), "--steps", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no running rank" in err
    assert not (tmp_path / "traces" / cf.REQUEST).exists()


def test_a_running_rank_that_never_answers_times_out(tmp_path, capsys):
    _register(tmp_path, os.getpid(), start_ticks())   # this process: running, and never at a step boundary
    assert main(["trace", "capture", str(tmp_path), "--steps", "2", "--timeout", "0.3"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rank 0 did not answer within 0.3 s" in err
    assert cf.parse_request((tmp_path / cf.REQUEST).read_bytes())["kind"] == "poll"   # no capture was asked
