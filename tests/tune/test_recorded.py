"""The tuner on one machine, without Prometheus: each trial scored and pruned from its own recording,
its report written beside it and linked from the tuning report."""
import optuna
import pytest

from otel_gpu.tune import report
from otel_gpu.tune.recorded import RecordingObjective
from otel_gpu.tune.space import parse_space
from otel_gpu.tune.study import Tuner

from .helpers import clean_env, copy_base, fake_command
from .test_study import _settings


@pytest.mark.slow
def test_trials_are_scored_and_pruned_from_their_recordings(tmp_path):
    base = copy_base(tmp_path)
    space = parse_space({"enqueue": [{"overlap_comm": True, "reduce_bucket_size": 10**9}]})
    s = _settings(tmp_path, base, fake_command(steps=60), trials=3, space=space, timeout_s=60.0,
                  export_interval_ms=200, poll_s=0.3, prune_min_steps=3, prune_ratio=1.25, min_steps=5,
                  node_agent=True)
    # each trial's node agent reads one fake Hopper GPU (the one fake at the NVML boundary)
    tuner = Tuner(s, RecordingObjective(warmup=3), env=clean_env(OTELGPU_FAKE_GPUS="1", OTELGPU_INTERVAL="0.2"))
    tuner.prepare()
    records = {r.number: r for r in tuner.run()}
    # the same three trials as from Prometheus: 60 ms baseline, 20 ms best, the 50 ms one pruned
    assert [records[i].status for i in range(3)] == ["ok", "ok", "pruned"], records
    assert records[0].step_time_s == pytest.approx(0.060, abs=0.01)
    assert records[1].step_time_s == pytest.approx(0.020, abs=0.006)
    assert "the best" in records[2].reason
    assert tuner.study.trials[2].state == optuna.trial.TrialState.PRUNED and tuner.study.trials[2].intermediate_values
    for i in range(2):   # the node agent's readings over each scored trial's steady window
        ev = records[i].evidence
        assert 0 <= ev["sm_activity"] <= 1 and 0 <= ev["tensor_activity"] <= 1 and 0 <= ev["gpu_utilization"] <= 1, ev
        assert ev["gpu_memory_peak_bytes"] > 0 and 0 <= ev["cpu_busy"] <= 1, ev
        assert ev["nic_bytes_per_s"] is not None and ev["nic_bytes_per_s"] >= 0, ev
        assert ev["not_checked"]["ib_bytes_per_s"] == "not checked: no InfiniBand port on this node"
        assert ev["not_checked"]["collectives"].startswith("not measured: no collective timed"), ev
        assert (s.out / "trials" / f"{i:04d}" / "recording" / "agent.log").exists()
    for i in range(3):   # every trial, pruned ones included, has its recording and its report
        assert (s.out / "trials" / f"{i:04d}" / "recording" / "report.html").stat().st_size > 100_000
    written = report.write_outputs(tuner.study, s.out)
    text = written["report"].read_text()
    assert "| [1](trials/0001/recording/report.html) |" in text
