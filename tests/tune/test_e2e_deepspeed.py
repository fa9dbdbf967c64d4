"""End to end: `otel-gpu tune` runs real DeepSpeed ZeRO-3 trials (CPU, gloo, 2 ranks, a tiny
transformer) whose step times flow through the training hooks into a real VictoriaMetrics,
and scores them with PromQL. In the same run: a trial made to hang is killed at its timeout,
a config DeepSpeed would reject is refused with its reason, the tuner is SIGKILLed mid-trial
and resumed with no trial lost or repeated, and the base config is byte-identical afterwards.
"""
import json
import shutil
import subprocess
import sys
import time

import optuna
import pytest
import sqlalchemy

from otel_gpu.promql import PromClient
from otel_gpu.tune import trial as T
from otel_gpu.tune.study import storage_url

from .helpers import CLI, EXAMPLE, REPO, Z3, clean_env, flushing, schema_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
HANG = "stage3_max_reuse_distance=1234567"
TIMEOUT_S = 75       # well above a normal trial here (15-40 s on 2 busy cores), so only the hang hits it


def _warm_deepspeed_ops() -> None:
    """DeepSpeed on CPU compiles its shared-memory comm op on first use (~1.5 min on 2 cores, then
    cached): do it once here so the baseline trial is not killed by the trial timeout."""
    from servers import free_port

    code = "import deepspeed; deepspeed.init_distributed(dist_backend='gloo')"
    env = clean_env(DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def _wait_running(db, number, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if schema_ready(db):   # never race the tuner's own creation of the tables
            try:
                trials = optuna.load_study(study_name="z3", storage=storage_url(db)).get_trials(deepcopy=False)
            except (KeyError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError):   # not there yet
                trials = []
            if len(trials) > number and trials[number].state == optuna.trial.TrialState.RUNNING \
                    and trials[number].user_attrs.get("pgid"):
                return trials[number].user_attrs
        time.sleep(0.5)
    raise AssertionError(f"trial {number} never started")


def test_tune_deepspeed_zero3_on_cpu(victoriametrics, tmp_path):
    pytest.importorskip("deepspeed", reason="deepspeed not installed (pip install deepspeed after torch==2.13.0)")
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not on PATH (comes with torch)")
    _warm_deepspeed_ops()
    vm = victoriametrics
    base = tmp_path / "ds_z3_config.json"
    shutil.copyfile(Z3, base)                                   # LLaMA-Factory's, "auto" values and all
    before = base.read_bytes()
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  train_micro_batch_size_per_gpu: [2, 3, 4]\n"
                     "enqueue:\n  - {train_micro_batch_size_per_gpu: 3}\n  - {stage3_max_reuse_distance: 1234567}\n")
    out = tmp_path / "out"
    command = (f"{torchrun} --standalone --nproc_per_node 2 {EXAMPLE} --deepspeed {{config}} --steps 10 "
               f"--simulate-hang {HANG}")
    argv = CLI + ["tune", "--base-config", str(base), "--command", command, "--trials", "6",
                  "--prometheus", vm.url, "--otlp", vm.url + "/opentelemetry", "--trial-timeout", str(TIMEOUT_S),
                  "--space", str(space), "--out", str(out), "--study-name", "z3",
                  "--hidden-size", "64", "--micro-batch", "4", "--grad-accum", "1", "--world-size", "2",
                  "--precision", "fp32", "--max-grad-norm", "1.0", "--warmup-steps", "2", "--min-steps", "4",
                  "--export-interval", "200", "--no-prune", "--seed", "0"]
    env = clean_env(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    db = out / "study.db"
    with flushing(vm):
        first = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # trials: 0 baseline, 1 rejected (never launched), 2 hangs until its timeout, 3 is running when
        # the tuner is SIGKILLed
        killed = _wait_running(db, 3, timeout=TIMEOUT_S + 240)
        first.kill()
        first.communicate(timeout=30)
        assert T.group_alive(killed["pgid"])                   # its ranks outlive the tuner...
        second = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert not T.group_alive(killed["pgid"])                   # ...until the resumed tuner kills them

    study = optuna.load_study(study_name="z3", storage=storage_url(db))
    trials = {t.number: t for t in study.get_trials()}
    status = {n: t.user_attrs.get("status") for n, t in trials.items()}
    assert status[0] == "ok" and trials[0].user_attrs["role"] == "baseline"
    assert status[1] == "rejected"
    assert trials[1].user_attrs["reason"] == ("train_batch_size=8 cannot be split into micro batches of 3 on 2 ranks "
                                              "(8 is not a multiple of 3 x 2)")
    assert not (out / "trials" / "0001" / "output.log").exists()
    assert status[2] == "timeout" and f"{TIMEOUT_S:g} s trial timeout" in trials[2].user_attrs["reason"]
    assert trials[2].params["stage3_max_reuse_distance"] == 1234567
    assert 2 <= trials[2].user_attrs["total_steps"] <= 3 * 2         # hung after 3 steps (count per rank)
    assert status[3] == "interrupted"

    counted = [t for t in trials.values() if t.user_attrs.get("status") not in (None, "interrupted")]
    assert len(counted) == 6
    retry = [t for t in counted if t.user_attrs.get("retry_of") == 3]
    assert len(retry) == 1 and retry[0].params == trials[3].params and retry[0].user_attrs["status"] == "ok"
    keys = [json.dumps(t.params, sort_keys=True) for t in counted]
    assert len(set(keys)) == len(keys)                              # nothing ran twice
    launched = [t for t in trials.values() if (out / "trials" / f"{t.number:04d}" / "output.log").exists()]
    assert len(launched) >= 6

    ok = [t for t in counted if t.user_attrs["status"] == "ok"]
    assert len(ok) >= 3
    client = PromClient(vm.url)
    for t in ok:                                                    # scored from PromQL, labelled by trial
        a = t.user_attrs
        assert a["steady_steps"] >= 4 and 6 <= a["total_steps"] <= 10 and 0.005 < a["step_time_s"] < 5
        series = client.query(f'otelgpu_train_steps_total{{otelgpu_trial="{a["trial_id"]}"}}')
        assert sorted(s.labels["otelgpu_rank"] for s in series) == ["0", "1"]
        assert all(s.value == 10 for s in series)
    assert study.best_value == min(t.value for t in ok)

    best = json.loads((out / "best_config.json").read_text())
    assert best == json.loads((out / "trials" / f"{study.best_trial.number:04d}" / "ds_config.json").read_text())
    assert best["zero_optimization"]["stage"] == 3 and "auto" not in json.dumps(best)
    md = (out / "report.md").read_text()
    assert "| 2 | seed | timeout |" in md and "| 3 | seed | interrupted |" in md and "baseline step time" in md
    assert base.read_bytes() == before
