"""A base config's "auto" values that DeepSpeed cannot resolve by itself get the Hugging Face Trainer's
default (said in one line), and a study whose baseline fails stops there with the baseline's reason
instead of launching every other trial into the same failure."""
from __future__ import annotations

import json
import subprocess

import pytest

from otel_gpu.tune import config as C
from otel_gpu.tune.space import parse_space
from otel_gpu.tune.study import Settings, Tuner, storage_url

from .helpers import CLI, REPO, Z3, clean_env, copy_base, fake_command

NO_CLIP = C.Facts(hidden_size=64, micro_batch=4, grad_accum=1, world_size=1, precision="fp32")   # no --max-grad-norm


def test_gradient_clipping_auto_gets_the_hf_default_and_a_note():
    base = json.loads(Z3.read_text())
    assert base["gradient_clipping"] == "auto"
    facts, notes = C.with_defaults(base, NO_CLIP)
    resolved = C.resolve_auto(base, facts)
    assert resolved["gradient_clipping"] == 1.0 and facts.max_grad_norm == 1.0
    assert len(notes) == 1 and "assumed 1.0," in notes[0] and "--max-grad-norm" in notes[0]
    assert C.left_auto(resolved) == []
    # a value given by flag is used as given, with nothing assumed
    facts, notes = C.with_defaults(base, C.Facts(max_grad_norm=0.5))
    assert C.resolve_auto(base, facts)["gradient_clipping"] == 0.5 and notes == []
    # a number in the config is the user's: kept, nothing assumed
    facts, notes = C.with_defaults({**base, "gradient_clipping": 2.0}, NO_CLIP)
    assert facts.max_grad_norm is None and notes == []


def test_batch_values_left_auto_are_named_in_one_line():
    base = json.loads(Z3.read_text())
    facts, _ = C.with_defaults(base, C.Facts(hidden_size=64))
    lines = C.left_auto(C.resolve_auto(base, facts))
    assert len(lines) == 1
    assert lines[0].startswith("train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps left")
    assert "--micro-batch" in lines[0] and "--max-grad-norm" not in lines[0]


def test_deepspeed_accepts_the_resolved_baseline():
    """DeepSpeed's own config object over the resolved base: its gradient clipping compares with a number
    (with "auto" left in, the engine's `gradient_clipping() > 0.0` raised TypeError in every trial)."""
    pytest.importorskip("deepspeed", reason="deepspeed not installed (pip install deepspeed after torch==2.13.0)")
    from deepspeed.runtime.config import DeepSpeedConfig

    base = json.loads(Z3.read_text())
    facts, _ = C.with_defaults(base, NO_CLIP)
    ds = DeepSpeedConfig(C.resolve_auto(base, facts))
    assert ds.gradient_clipping > 0.0 and ds.gradient_clipping == 1.0
    assert ds.train_batch_size == 4


def test_the_tuner_says_what_it_assumed(tmp_path):
    notes = []
    out = tmp_path / "out"
    s = Settings(base_config=copy_base(tmp_path), command=fake_command(), trials=1, out=out,
                 storage=storage_url(out / "study.db"), study_name="t", space=parse_space({}),
                 facts=NO_CLIP, deepspeed_check=False)
    tuner = Tuner(s, objective=None, env=clean_env(), events=lambda kind, p: notes.append(p) if kind == "note" else None)
    tuner.prepare()
    assert tuner.base["gradient_clipping"] == 1.0
    assert [n for n in notes if n.startswith('gradient_clipping "auto": assumed 1.0,')], notes


def _tune(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    base = copy_base(tmp_path)
    # the baseline keeps the config's overlap_comm=false; the fake crashes at its third step on it
    argv = CLI + ["tune", "--base-config", str(base), "--command", fake_command("--crash-when overlap_comm=False"),
                  "--trials", "5", "--out", str(tmp_path / "out"), "--study-name", "t", "--hidden-size", "64",
                  "--micro-batch", "4", "--grad-accum", "1", "--world-size", "2", "--precision", "fp32",
                  "--no-instrument", "--no-deepspeed-check", "--seed", "0", "--trial-timeout", "60", *extra]
    return subprocess.run(argv, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)


def test_a_failed_baseline_stops_the_study_with_its_reason(tmp_path):
    done = _tune(tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("otel-gpu tune: the baseline (trial 0, your config unchanged) failed: crash: ")
    assert "RuntimeError: simulated crash in the training loop" in lines[0] and "--keep-going" in lines[0]
    trials = sorted(p.name for p in (tmp_path / "out" / "trials").iterdir())
    assert trials == ["0000"], trials                               # nothing launched after it
    assert (tmp_path / "out" / "report.md").is_file()               # what ran is reported
    again = _tune(tmp_path)                                          # resumed as is: stops before any trial
    assert again.returncode == 1 and "the baseline (trial 0" in again.stderr
    assert sorted(p.name for p in (tmp_path / "out" / "trials").iterdir()) == ["0000"]


def test_keep_going_runs_the_other_trials(tmp_path):
    done = _tune(tmp_path, "--keep-going")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads((tmp_path / "out" / "trials.json").read_text())
    assert len(rows) == 5 and rows[0]["status"] == "crash"
    assert any(r["status"] == "ok" for r in rows[1:]), rows
