"""Scoring by other objectives than step time: a multi-objective study over each trial's own recording
(step time against tokens/s: a Pareto front of two; a trial whose job counts no tokens failed with the
reason, never scored 0; a resume with other objectives refused), and the --objective flag's parser."""
import contextlib
import io

import optuna
import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.cli import build_parser
from otel_gpu.tune import report
from otel_gpu.tune import scores as SC
from otel_gpu.tune.recorded import RecordingObjective
from otel_gpu.tune.space import parse_space
from otel_gpu.tune.study import Tuner

from .helpers import clean_env, copy_base, fake_command
from .test_study import _settings

TOKENS = 1000   # tokens of a 20 ms step in the fake job (N x (t/20 ms)^2 a step)


@pytest.mark.slow
def test_multi_objective_study_reports_its_pareto_front_and_fails_a_trial_without_tokens(tmp_path):
    base = copy_base(tmp_path)
    # the baseline steps in ~60 ms, trial 1 in ~20 ms (faster steps, fewer tokens a second); trial 2's
    # config counts no tokens: it cannot be scored by tokens/s
    space = parse_space({"enqueue": [{"overlap_comm": True, "reduce_bucket_size": 10**9},
                                     {"overlap_comm": True, "reduce_bucket_size": 10**8}]})
    cmd = fake_command("--tokens", str(TOKENS), "--no-tokens-when reduce_bucket_size=100000000", steps=16)
    s = _settings(tmp_path, base, cmd, trials=3, space=space, timeout_s=60.0, export_interval_ms=150, min_steps=5,
                  baseline_runs=1, objectives=("step_time", "tokens_per_s"))
    tuner = Tuner(s, RecordingObjective(warmup=3), env=clean_env())
    tuner.prepare()
    records = {r.number: r for r in tuner.run()}
    assert [records[i].status for i in range(3)] == ["ok", "ok", "incomplete"], records
    assert tuner.study.directions == [optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE]
    for r in (records[0], records[1]):
        ev, t = r.evidence, r.step_time_s
        # tokens a second over the steady window against the job's own rate: N (t/20 ms)^2 tokens per step of t s
        assert ev["tokens_per_s"] == pytest.approx(TOKENS * (t / 0.020) ** 2 / t, rel=0.25), (ev, t)
        assert tuner.study.trials[r.number].values == [t, ev["tokens_per_s"]]
        assert ev["not_checked"]["joules_per_token"].startswith("not checked: no GPU readings"), ev
        assert ev["not_checked"]["tflops_per_gpu"].startswith("not checked: no model FLOPs"), ev
    assert records[1].step_time_s < records[0].step_time_s and \
        records[1].evidence["tokens_per_s"] < records[0].evidence["tokens_per_s"]
    # measured, but not scored 0: failed with the evidence's reason
    assert records[2].step_time_s is not None and records[2].reason.startswith("tokens_per_s: not checked: no tokens")
    assert tuner.study.trials[2].state == optuna.trial.TrialState.FAIL and tuner.study.trials[2].values is None
    assert [t.number for t in SC.front(tuner.study)] == [0, 1]       # neither is better in both
    text = report.markdown(tuner.study)
    assert "- scored by: step_time (minimize), tokens_per_s (maximize); the Pareto front (2 trials):" in text
    assert "  - trial 1: " in text and " tokens/s (" in text and "| tokens/s | TFLOP/s per GPU | J/step | J/token |" in text
    assert not (s.out / "best_config.json").exists()       # several best trials: the front is listed instead
    # a resume must score by the same objectives
    again = _settings(tmp_path, s.base_config, s.command, trials=3, objectives=("joules_per_token",))
    with pytest.raises(Exception, match="started with --objective step_time,tokens_per_s"):
        Tuner(again, RecordingObjective(warmup=3), env=clean_env()).prepare()


def test_values_follow_the_evidence_and_missing_inputs_say_why():
    ev = {"tokens_per_s": 2000.0, "joules_per_token": None, "not_checked": {"joules_per_token": "not checked: MIG"}}
    assert SC.values_of(("step_time", "tokens_per_s"), 0.05, ev) == ([0.05, 2000.0], "")
    assert SC.values_of(("tokens_per_s", "joules_per_token"), 0.05, ev) == (None, "joules_per_token: not checked: MIG")
    assert SC.values_of(("tflops_per_gpu",), 0.05, {})[1].startswith("tflops_per_gpu: not checked")
    assert SC.values_of(("step_time",), None, ev) == (None, "step_time: not checked: no step time")
    assert SC.directions(("joules_per_token", "tflops_per_gpu")) == ["minimize", "maximize"]


_NAME = st.sampled_from(sorted(SC.OBJECTIVES))


@settings(max_examples=60, deadline=None)
@given(st.lists(_NAME, min_size=1, max_size=4, unique=True))
def test_objective_names_parse(names):
    assert SC.parse(",".join(names)) == tuple(names)
    assert SC.parse(" , ".join(names)) == tuple(names)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_objective_flag_refuses_anything_else(raw):
    parts = [p.strip() for p in raw.split(",")]
    ok = all(p in SC.OBJECTIVES for p in parts) and len(set(parts)) == len(parts)
    if ok:
        assert SC.parse(raw) == tuple(parts)
        return
    with pytest.raises(ValueError) as err:
        SC.parse(raw)
    assert "\n" not in str(err.value) and "objective" in str(err.value)


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.text(max_size=30), st.lists(_NAME, min_size=1, max_size=5).map(",".join)))
def test_objective_flag_gives_known_names_or_one_line_exit_2(raw):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args(["tune", "--base-config", "x.json", f"--objective={raw}"])
        except SystemExit as exc:
            assert exc.code == 2 and err.getvalue().count("\n") == 1 and "--objective" in err.getvalue(), err.getvalue()
            return
    assert args.objective and set(args.objective) <= set(SC.OBJECTIVES) and len(set(args.objective)) == len(args.objective)
    assert args.objective == tuple(p.strip() for p in raw.split(","))


def test_work_evidence_numbers_and_reasons():
    from otel_gpu.energy import Energy, NO_GPU
    from otel_gpu.tune.work_evidence import NO_FLOPS, NO_GPUS, NO_TOKENS, combine
    joined = Energy("job", ("0",), ("0",), joules=600.0, seconds=10.0, steps=20.0, tokens=6000.0,
                    j_per_step=30.0, j_per_token=0.1)
    ev = combine(tokens=6000.0, flops=4e14, gpus=2, energy=joined, seconds=10.0)
    assert ev["tokens_per_s"] == 600.0 and ev["tflops_per_gpu"] == pytest.approx(20.0)
    assert (ev["joules_per_step"], ev["joules_per_token"], ev["not_checked"]) == (30.0, 0.1, {})
    none = Energy("job", (), (), why_step=NO_GPU, why_token=NO_GPU)
    ev = combine(tokens=None, flops=4e14, gpus=0, energy=none, seconds=10.0)
    assert ev["tokens_per_s"] is ev["tflops_per_gpu"] is ev["joules_per_token"] is None
    assert ev["not_checked"] == {"tokens_per_s": NO_TOKENS, "tflops_per_gpu": NO_GPUS,
                                 "joules_per_step": NO_GPU, "joules_per_token": NO_GPU}
    assert combine(6000.0, None, 2, joined, 10.0)["not_checked"] == {"tflops_per_gpu": NO_FLOPS}
