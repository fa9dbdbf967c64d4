"""The tuning loop with a fast fake job: failure classes, best config, report, pruning from
PromQL, and resume after the tuner is stopped (SIGTERM) or killed (SIGKILL) mid-trial."""
import json
import signal
import subprocess
import time

import optuna
import pytest

from otel_gpu.cli import main
from otel_gpu.promql import PromClient
from otel_gpu.tune import config as C
from otel_gpu.tune import report
from otel_gpu.tune import trial as T
from otel_gpu.tune.objective import LogObjective, PromObjective
from otel_gpu.tune.space import parse_space
from otel_gpu.tune import evidence as E
from otel_gpu.tune.study import Settings, Tuner, storage_url

from .helpers import CLI, REPO, clean_env, copy_base, fake_command, flushing, schema_ready

FACTS = C.Facts(hidden_size=64, micro_batch=4, grad_accum=1, world_size=2, max_grad_norm=1.0, precision="fp32")


def _settings(tmp_path, base, command, trials, space=None, **kw):
    out = tmp_path / "out"
    return Settings(base_config=base, command=command, trials=trials, out=out,
                    storage=storage_url(out / "study.db"), study_name="t", space=space or parse_space({}),
                    facts=FACTS, seed=1, deepspeed_check=False, **kw)


def _statuses(study):
    return {t.number: t.user_attrs.get("status") for t in study.get_trials()
            if t.state != optuna.trial.TrialState.WAITING}


def test_failures_are_classified_and_never_best(tmp_path):
    base = copy_base(tmp_path)
    before = base.read_bytes()
    space = parse_space({
        "params": {"train_micro_batch_size_per_gpu": [2, 3, 4]},
        "enqueue": [{"train_micro_batch_size_per_gpu": 3},                      # 8 % (3 x 2): rejected
                    {"reduce_bucket_size": 1234567},                            # the fake runs out of memory
                    {"reduce_bucket_size": 7654321}]})                          # the fake hangs
    cmd = fake_command("--oom-when reduce_bucket_size=1234567", "--hang-when reduce_bucket_size=7654321")
    s = _settings(tmp_path, base, cmd, trials=6, space=space, timeout_s=4.0, grace_s=1.0, prune=False,
                  instrument=False)
    tuner = Tuner(s, LogObjective(warmup=2), env=clean_env())
    tuner.prepare()
    records = {r.number: r for r in tuner.run()}
    assert _statuses(tuner.study) == {0: "ok", 1: "rejected", 2: "oom", 3: "timeout", 4: "ok", 5: "ok"}
    assert records[1].reason == ("train_batch_size=8 cannot be split into micro batches of 3 on 2 ranks "
                                 "(8 is not a multiple of 3 x 2)")
    assert not (tmp_path / "out" / "trials" / "0001" / "output.log").exists()        # never launched
    assert "CUDA out of memory" in records[2].reason
    assert "4 s trial timeout" in records[3].reason and records[3].seconds < 8
    assert records[0].role == "baseline" and records[0].params["reduce_bucket_size"] == 64 * 64
    assert records[0].step_time_s == pytest.approx(0.060, abs=0.02)       # tqdm-style lines of the fake
    for r in records.values():
        result = json.loads((tmp_path / "out" / "trials" / f"{r.number:04d}" / "result.json").read_text())
        assert result["status"] == r.status
    assert tuner.study.best_trial.number in (4, 5)
    best = json.loads((tmp_path / "out" / "best_config.json").read_text())
    trial_cfg = json.loads((tmp_path / "out" / "trials" / f"{tuner.study.best_trial.number:04d}" / "ds_config.json").read_text())
    assert best == trial_cfg and C.auto_paths(best) == []
    baseline_cfg = json.loads((tmp_path / "out" / "trials" / "0000" / "ds_config.json").read_text())
    assert baseline_cfg == C.resolve_auto(json.loads(before), FACTS)
    assert base.read_bytes() == before
    md = report.markdown(tuner.study)
    trial_rows = [line for line in md.splitlines() if line[:3] in {f"| {i}" for i in range(10)}]
    assert len(trial_rows) == 6 and "| 1 | seed | rejected |" in md and "## Parameter importances" in md
    written = report.write_outputs(tuner.study, tmp_path / "out")
    assert set(written) == {"report", "trials", "best_config"}
    # asking for more trials of a finished study runs nothing new
    again = Tuner(s, LogObjective(warmup=2), env=clean_env())
    again.prepare()
    assert again.run() == [] and len(again.study.trials) == 6 + len(again.study.get_trials(states=(optuna.trial.TrialState.WAITING,)))


def test_pruning_from_prometheus(victoriametrics, tmp_path):
    vm = victoriametrics
    base = copy_base(tmp_path)
    space = parse_space({"enqueue": [{"overlap_comm": True, "reduce_bucket_size": 10**9}]})
    s = _settings(tmp_path, base, fake_command(steps=60), trials=3, space=space, timeout_s=30.0,
                  otlp_endpoint=vm.url + "/opentelemetry", export_interval_ms=200, poll_s=0.3,
                  prune_min_steps=3, prune_ratio=1.25, min_steps=5)
    obj = PromObjective(PromClient(vm.url), warmup=3, settle_s=10)
    tuner = Tuner(s, obj, env=clean_env())
    tuner.prepare()
    with flushing(vm):
        records = {r.number: r for r in tuner.run()}
    # 0: the baseline (60 ms/step, nothing to compare with yet); 1: 20 ms, the best;
    # 2: overlap_comm only, 50 ms/step: 2.5x the best, stopped after its warm-up
    assert [records[i].status for i in range(3)] == ["ok", "ok", "pruned"], records
    assert records[0].step_time_s == pytest.approx(0.060, abs=0.01)
    assert records[1].step_time_s == pytest.approx(0.020, abs=0.006)
    assert "the best" in records[2].reason and records[2].seconds < records[0].seconds * 0.8
    assert tuner.study.trials[2].state == optuna.trial.TrialState.PRUNED
    assert tuner.study.trials[2].intermediate_values                    # reported while running
    ev = records[1].evidence   # no node agent exports here: every reading says so, none is made up
    assert all(ev[k] is None for k, *_ in E.COLUMNS) and ev["collectives"] is None, ev
    assert set(ev["not_checked"]) == {k for k, *_ in E.COLUMNS} | {"collectives"}
    assert ev["not_checked"]["sm_activity"] == "not checked: no node agent readings in the window"


def _wait_running(db, number, timeout=60):
    """Wait until trial `number` of study 't' runs with its process group recorded; its attrs."""
    import sqlalchemy.exc

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not schema_ready(db):   # never race the tuner's own creation of the tables
            time.sleep(0.2)
            continue
        try:
            study = optuna.load_study(study_name="t", storage=storage_url(db))
            trials = study.get_trials(deepcopy=False)
            if len(trials) > number and trials[number].state == optuna.trial.TrialState.RUNNING \
                    and trials[number].user_attrs.get("pgid"):
                return trials[number].user_attrs
        except (KeyError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError):   # not there yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"trial {number} never started")


def test_stop_and_kill_mid_study_then_resume(tmp_path):
    base = copy_base(tmp_path)
    before = base.read_bytes()
    out = tmp_path / "out"
    # trials 1 and 3 run until they are stopped: each is certainly mid-trial when its tuner is stopped,
    # and the orphan of step 2 can only end because the resume kills it
    held = fake_command("--trial {trial}", "--hold-trials 1,3", "--hold-s 90", steps=25)
    argv = CLI + ["tune", "--base-config", str(base), "--command", held, "--trials", "6",
                  "--out", str(out), "--study-name", "t", "--hidden-size", "64", "--no-prune", "--seed", "3",
                  "--trial-timeout", "30", "--no-deepspeed-check"]
    env = clean_env()
    run = lambda: subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # 1. SIGTERM during trial 1: the tuner kills the trial's group, marks it, exits 130
    proc = run()
    attrs = _wait_running(out / "study.db", 1)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, text
    assert not T.group_alive(attrs["pgid"])

    # 2. resume, then SIGKILL during trial 3: its process group is orphaned but keeps running
    proc = run()
    attrs = _wait_running(out / "study.db", 3)
    assert attrs["pg_start"] == T.start_time(attrs["pgid"])   # recorded before the pgid a resume looks for
    proc.kill()
    proc.wait(timeout=10)
    assert T.group_alive(attrs["pgid"])

    # 3. resume to the end: the orphan is killed, nothing lost, nothing repeated
    proc = run()
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, text
    assert not T.group_alive(attrs["pgid"])
    study = optuna.load_study(study_name="t", storage=storage_url(out / "study.db"))
    trials = study.get_trials()
    interrupted = [t for t in trials if t.user_attrs.get("status") == T.INTERRUPTED]
    assert [t.number for t in interrupted] == [1, 3]
    finished = [t for t in trials if t.user_attrs.get("status") not in (T.INTERRUPTED, None)]
    assert len(finished) == 6 and all(t.user_attrs["status"] == "ok" for t in finished)
    for t in interrupted:                       # each retried exactly once, with the same parameters
        retries = [r for r in finished if r.user_attrs.get("retry_of") == t.number]
        assert len(retries) == 1 and retries[0].params == t.params
    keys = [json.dumps(t.params, sort_keys=True) for t in finished]
    assert len(set(keys)) == len(keys)
    assert [t.user_attrs["role"] for t in finished].count("baseline") == 1
    assert sorted(p.name for p in (out / "trials").iterdir()) == [f"{i:04d}" for i in range(len(trials))]
    assert base.read_bytes() == before
    assert (out / "best_config.json").is_file() and "interrupted" in (out / "report.md").read_text()


@pytest.mark.parametrize("extra, message", [
    (["--command", "python train.py"], "must contain {config}"),
    (["--hidden-size", "0"], "argument --hidden-size: '0': must be >= 1"),
    (["--trial-timeout", "nan"], "argument --trial-timeout: 'nan': must be a finite number"),
    (["--prune-ratio", "inf"], "argument --prune-ratio: 'inf': must be a finite number"),
    (["--prometheus", "localhost:9090"], "expected a URL"),
    (["--otlp", "http://"], "the URL has no host"),
    (["--space", "/nonexistent.yaml"], "cannot read space file"),
])
def test_cli_usage_errors(tmp_path, capsys, extra, message):
    base = copy_base(tmp_path)
    argv = ["tune", "--base-config", str(base), "--command", "x {config}", "--out", str(tmp_path / "o"),
            "--hidden-size", "64"] + extra
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_cli_prometheus_down_is_a_runtime_failure(tmp_path, capsys):
    base = copy_base(tmp_path)
    argv = ["tune", "--base-config", str(base), "--command", "x {config}", "--out", str(tmp_path / "o"),
            "--hidden-size", "64", "--prometheus", "http://127.0.0.1:9"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert "unreachable" in err and "\n" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (b"\x80\x81", "not UTF-8 text"),
])
def test_cli_malformed_base_config_is_one_line_exit_2(tmp_path, capsys, content, message):
    base = tmp_path / "ds.json"
    base.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["tune", "--base-config", str(base), "--command", "x {config}", "--out", str(tmp_path / "o"),
                 "--hidden-size", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_cli_refuses_unresolvable_or_wrong_base(tmp_path, capsys):
    base = copy_base(tmp_path)
    assert main(["tune", "--base-config", str(base), "--command", "x {config}", "--out", str(tmp_path / "o")]) == 2
    assert "pass --hidden-size or --model" in capsys.readouterr().err
    stage2 = tmp_path / "s2.json"
    stage2.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert main(["tune", "--base-config", str(stage2), "--command", "x {config}", "--out", str(tmp_path / "o")]) == 2
    assert "tunes ZeRO stage 3" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_resume_with_a_different_base_is_refused(tmp_path):
    base = copy_base(tmp_path)
    s = _settings(tmp_path, base, fake_command(steps=6), trials=1, prune=False, instrument=False)
    tuner = Tuner(s, LogObjective(warmup=1), env=clean_env())
    tuner.prepare()
    tuner.run()
    report_dir = tmp_path / "report"
    argv = ["tune", "--base-config", str(base), "--study", str(tmp_path / "out" / "study.db"), "--study-name", "t",
            "--out", str(report_dir), "--report-only"]
    assert main(argv) == 0
    assert "| 0 | baseline | **ok** |" in (report_dir / "report.md").read_text()
    assert (report_dir / "best_config.json").read_text() == (tmp_path / "out" / "trials" / "0000" / "ds_config.json").read_text()
    assert main(argv[:4] + [str(tmp_path / "none.db")] + argv[5:]) == 2 and not (tmp_path / "none.db").exists()
    cfg = json.loads(base.read_text())
    cfg["zero_optimization"]["overlap_comm"] = True
    base.write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="different base config"):
        Tuner(s, LogObjective(warmup=1), env=clean_env()).prepare()


def test_memory_limit_fails_a_trial(victoriametrics, tmp_path):
    """Peak GPU memory over the trial's steady window (as the node agent exports it) above the limit."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.metrics import Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    from otel_gpu import names

    vm, host = victoriametrics, f"mem-{time.time_ns()}"
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=vm.otlp_metrics_url), export_interval_millis=200)
    provider = MeterProvider(resource=Resource.create({"host.name": host}), metric_readers=[reader])
    provider.get_meter("agent-stand-in").create_observable_up_down_counter(
        names.GPU_MEMORY_USAGE.name, [lambda o: [Observation(70 * 2**30, {names.HW_ID: "GPU-0"})]], unit="By")
    base = copy_base(tmp_path)
    s = _settings(tmp_path, base, fake_command(steps=30), trials=1, prune=False, max_memory_bytes=64 * 2**30,
                  otlp_endpoint=vm.url + "/opentelemetry", export_interval_ms=200)
    tuner = Tuner(s, PromObjective(PromClient(vm.url), warmup=3, selector=f'host_name="{host}"', settle_s=10),
                  env=clean_env())
    tuner.prepare()
    try:
        with flushing(vm):
            (record,) = tuner.run()
    finally:
        provider.shutdown()
    assert record.status == "over-memory", record
    assert record.reason == "peak GPU memory 70.00 GiB over the 64.00 GiB limit"
    assert record.evidence["gpu_memory_peak_bytes"] == 70 * 2**30 and record.step_time_s > 0
    assert not (tmp_path / "out" / "best_config.json").exists()


def test_two_workers_share_one_study(tmp_path):
    """Two tuner processes on one SQLite study: every trial runs once, in its own folder."""
    base = copy_base(tmp_path)
    out = tmp_path / "out"
    argv = CLI + ["tune", "--base-config", str(base), "--command", fake_command(steps=15), "--trials", "8",
                  "--out", str(out), "--study-name", "t", "--hidden-size", "64", "--no-prune",
                  "--trial-timeout", "30", "--no-deepspeed-check"]
    procs = [subprocess.Popen(argv, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    study = optuna.load_study(study_name="t", storage=storage_url(out / "study.db"))
    done = [t for t in study.get_trials() if t.state != optuna.trial.TrialState.WAITING]
    assert len(done) == 8 and all(t.user_attrs["status"] == "ok" for t in done)   # counted and asked under one lock
    assert len({t.user_attrs["tuner_pid"] for t in done}) == 2          # both worked
    # the baseline once, and once more as its planned repeat (noise), never twice by accident
    assert sorted(t.user_attrs.get("repeat", 0) for t in done if t.user_attrs["role"] == "baseline") == [0, 1]
    assert len({json.dumps(t.params, sort_keys=True) for t in done}) == len(done) - 1   # the repeat: same params
    assert len(list((out / "trials").iterdir())) == len(done)


def test_diagnose_spaces_resolve_a_baseline(tmp_path):
    """The spaces `otel-gpu diagnose --tune-space` writes work as --space on LLaMA-Factory's config."""
    from otel_gpu.diagnose.comm import BANDWIDTH_SPACE, LATENCY_SPACE
    from otel_gpu.tune.study import TuneError

    base = copy_base(tmp_path)
    for doc in (LATENCY_SPACE, BANDWIDTH_SPACE):
        tuner = Tuner(_settings(tmp_path, base, "x {config}", trials=1, space=parse_space(doc)), LogObjective(1))
        tuner.prepare()
        assert tuner.baseline["reduce_bucket_size" if doc is LATENCY_SPACE else "stage3_max_reuse_distance"] > 0
        tuner.study = None
        for f in (tmp_path / "out").iterdir():
            f.unlink()
    assert tuner.baseline["zero_optimization.zero_hpz_partition_size"] == 1
    odd = parse_space({"params": {"zero_optimization.future_knob": {"choices": [1, 2]}}})
    with pytest.raises(TuneError, match="future_knob is tuned but missing from the base config"):
        Tuner(_settings(tmp_path, base, "x {config}", trials=1, space=odd), LogObjective(1)).prepare()
