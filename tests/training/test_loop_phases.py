"""An untouched DataLoader loop under `otel-gpu run`, against what the script measured itself:
forward timed for a plain loop, slow saves counted while they run (not in one jump after),
and the first batch not carrying otel-gpu's start-up."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import HERE, REPO, clean_env

from otel_gpu import names as N
from otel_gpu.record.reader import Recording

pytestmark = pytest.mark.slow
RUN = [sys.executable, "-m", "otel_gpu", "run"]
SAVE_S = 2.2     # each save spans two or three 1 s exports


@dataclass
class Loop:
    directory: Path
    truth: dict            # what the script measured: per-step data_wait/forward/step, saves [start, end]


def _loop_args(out: Path, steps: int, every: int, tmp: Path) -> list[str]:
    return [sys.executable, str(HERE / "loader_loop.py"), str(steps), str(out), "0.02", str(every), str(SAVE_S),
            str(tmp / "ck.pt")]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Loop:
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    tmp = tmp_path_factory.mktemp("loop")
    every = random.Random().randint(7, 11)    # the saves move from run to run
    out, d = tmp / "truth.json", tmp / "rec"
    proc = subprocess.run(RUN + ["--record", str(d), "--no-report", "--no-agent", "--", *_loop_args(out, 3 * every + 2, every, tmp)],
                          env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Loop(d, json.loads(out.read_text()))


def _phases(directory: Path) -> dict[str, list[tuple[float, float]]]:
    with Recording.open([directory]) as rec:
        return {s.get(N.PHASE): s.points for s in rec.series(N.TRAIN_PHASE_TIME.name)}


def test_a_plain_loop_gets_its_model_call_as_forward(recorded):
    phases = _phases(recorded.directory)
    assert {"data_wait", "forward", "backward", "optimizer", "checkpoint"} <= set(phases)
    script_forward = sum(r["forward"] for r in recorded.truth["steps"])
    measured = phases["forward"][-1][1]
    # the model call (what the script timed) plus the loss module's call, nothing of backward or the saves
    assert 0.9 * script_forward <= measured <= 1.3 * script_forward + 0.1, (measured, script_forward)


def test_each_save_is_counted_while_it_runs(recorded):
    """Exports that fall inside a save already carry the part of it done so far (before, a save
    appeared whole at the first export after its end)."""
    points = _phases(recorded.directory)["checkpoint"]
    values = [v for _, v in points]
    assert values == sorted(values)                      # a counter: never goes back
    saves = recorded.truth["saves"]
    assert len(saves) == 3
    for i, (start, end) in enumerate(saves):
        before = sum(e - s for s, e in saves[:i])        # the earlier saves, as the script timed them
        inside = [(t, v) for t, v in points if start + 0.3 < t < end - 0.05]
        assert inside, f"no export inside the save {start:.2f}..{end:.2f}"
        for t, v in inside:
            assert abs((v - before) - (t - start)) < 0.3, (t - start, v - before)
    total = sum(e - s for s, e in saves)
    assert abs(values[-1] - total) < 0.1 * total, (values[-1], total)


def test_the_first_batch_does_not_carry_the_start_up(recorded, tmp_path):
    """The script's own first `next()` under `otel-gpu run` against the same script alone (before:
    about 0.1 s more, the exporter's imports and the session's start)."""
    out = tmp_path / "plain.json"
    proc = subprocess.run(_loop_args(out, 3, 0, tmp_path), env=clean_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alone = json.loads(out.read_text())["steps"][0]["data_wait"]
    under_run = recorded.truth["steps"][0]["data_wait"]
    assert under_run - alone < 0.04, (under_run, alone)
