"""Step time from histogram samples (pure), from training logs (pure), and from a real VictoriaMetrics."""
import json
import subprocess
import sys
import time

import pytest

from otel_gpu.promql import PromClient, Series
from otel_gpu.tune import objective as O

from .helpers import FAKE, clean_env, flushing


def _hist(rank, points, world="2", host="n1", trial="s-1"):
    """points: [(t, count, sum)] -> the _count and _sum series of one rank."""
    labels = {"otelgpu_rank": rank, "otelgpu_world_size": world, "host_name": host, "otelgpu_trial": trial}
    return [Series({"__name__": O.STEP_METRIC + "_count", **labels}, [(t, c) for t, c, _ in points]),
            Series({"__name__": O.STEP_METRIC + "_sum", **labels}, [(t, s) for t, _, s in points])]


def test_steady_window_excludes_warmup_and_takes_the_slowest_rank():
    # rank 0: 2 warm-up steps of 1 s, then 0.1 s steps; rank 1: 0.2 s steps after warm-up
    r0 = _hist("0", [(10, 1, 1.0), (11, 3, 1.2), (12, 13, 2.2), (13, 23, 3.2)])
    r1 = _hist("1", [(10, 1, 1.0), (11, 3, 1.4), (12, 8, 2.4), (13, 13, 3.4)])
    stats = O.steady_from_histogram(r0 + r1, warmup=3)
    assert stats.step_time_s == pytest.approx(0.2)           # rank 1: (3.4 - 1.4) / (13 - 3)
    assert (stats.steady_steps, stats.total_steps, stats.ranks, stats.expected_ranks) == (10, 23, 2, 2)
    assert stats.window == (11, 13) and stats.problem(5) is None
    assert stats.per_rank["n1/0"] == pytest.approx(0.1)


def test_completeness_checks():
    one_rank = O.steady_from_histogram(_hist("0", [(10, 3, 1.0), (12, 20, 3.0)]), warmup=3)
    assert one_rank.problem(5) == "only 1 of 2 ranks reported steps"
    short = O.steady_from_histogram(_hist("0", [(10, 3, 1.0), (12, 5, 1.2)], world="1"), warmup=3)
    assert short.problem(5) == "2 steps after warm-up, 5 needed (5 seen)"
    assert O.steady_from_histogram([], warmup=3).problem(5) == "no step metrics seen (prometheus)"
    # every sample still inside warm-up: no steady window at all
    early = O.steady_from_histogram(_hist("0", [(10, 1, 1.0), (11, 2, 2.0)], world="1"), warmup=3)
    assert early.step_time_s is None and early.problem(1).startswith("0 steps after warm-up")


def test_trainer_log_jsonl():
    rows = [{"current_steps": s, "total_steps": 100, "loss": 2.0, "lr": 1e-5, "epoch": s / 100,
             "percentage": s, "elapsed_time": e, "remaining_time": "0:10:00"}
            for s, e in [(5, "0:00:40"), (10, "0:00:50"), (15, "0:01:00"), (20, "0:01:10"), (25, "1:00:00")]]
    text = "\n".join(json.dumps(r) for r in rows[:4]) + "\nnot json\n"
    stats = O.parse_trainer_log(text, warmup=10)
    assert stats.step_time_s == pytest.approx(2.0) and stats.steady_steps == 10 and stats.total_steps == 20
    assert stats.source == "trainer_log.jsonl"
    assert O._hms("1 day, 0:00:01") == 86401 and O._hms("12:03") == 723


def test_progress_lines_short_and_long_spans():
    short = "\r".join(f"{i}/40 [00:0{i // 4}<00:10,  {5.0 if i > 2 else 1.0:.2f}it/s]" for i in range(1, 20))
    stats = O.parse_progress(short, warmup=3)
    assert stats.step_time_s == pytest.approx(0.2) and stats.steady_steps == 16
    long = "\n".join(f" {i}/100 [{(10 + 3 * i) // 60:02d}:{(10 + 3 * i) % 60:02d}<01:00,  3.00s/it]" for i in range(1, 30))
    stats = O.parse_progress(long, warmup=5)
    assert stats.step_time_s == pytest.approx(3.0) and stats.steady_steps == 24
    assert O.parse_progress("nothing here", 3).problem(1) == "no step metrics seen (progress bar)"


def test_log_objective_prefers_trainer_log(tmp_path):
    (tmp_path / "output.log").write_text("\r".join(f"{i}/20 [00:00<00:01, 10.00it/s]" for i in range(1, 20)))
    obj = O.LogObjective(warmup=2)
    assert obj.measure("x", tmp_path, 0).step_time_s == pytest.approx(0.1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "trainer_log.jsonl").write_text(
        "\n".join(json.dumps({"current_steps": s, "elapsed_time": f"0:00:{s * 3:02d}"}) for s in (2, 4, 6)))
    assert obj.measure("x", tmp_path, 0).step_time_s == pytest.approx(3.0)


def test_prom_objective_reads_real_training_hooks(victoriametrics, tmp_path):
    """The fake job times its steps with otel_gpu.training; the trial id reaches PromQL as a label."""
    vm = victoriametrics
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 3, "overlap_comm": True, "reduce_bucket_size": 10**9}}))
    trial_id = f"objective-{time.time_ns()}"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=vm.url + "/opentelemetry", OTEL_METRIC_EXPORT_INTERVAL="200",
                    OTEL_RESOURCE_ATTRIBUTES=f"otelgpu.trial={trial_id}", RANK="0", WORLD_SIZE="1")
    start = time.time()
    with flushing(vm):
        subprocess.run([sys.executable, str(FAKE), "--deepspeed", str(cfg), "--steps", "30"], env=env, check=True,
                       capture_output=True, timeout=60)
        obj = O.PromObjective(PromClient(vm.url), warmup=3, settle_s=10, fresh_s=0.5)
        stats = obj.final(trial_id, tmp_path, start, time.time(), min_steps=5)
    assert stats.problem(5) is None, stats
    # scored from what is queryable once complete: the rank's exit-time export may still be in flight
    assert 10 <= stats.total_steps <= 30 and stats.ranks == 1 and stats.expected_ranks == 1
    assert stats.step_time_s == pytest.approx(0.020, abs=0.006)         # the fake's 20 ms sleep
    other = obj.measure("no-such-trial", tmp_path, start)
    assert other.total_steps == 0


def test_evidence_queries_read_node_metrics(victoriametrics):
    """GPU readings pushed over OTLP under the node agent's names come back over the steady window."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.metrics import Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    from otel_gpu import names

    vm, host = victoriametrics, f"evidence-{time.time_ns()}"
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=vm.otlp_metrics_url), export_interval_millis=200)
    provider = MeterProvider(resource=Resource.create({"host.name": host}), metric_readers=[reader])
    meter = provider.get_meter("test")
    gpu = {names.HW_ID: "GPU-0", "host.name": host}
    meter.create_observable_gauge(names.GPU_SM_ACTIVITY.name, [lambda o: [Observation(0.28, gpu)]], unit="1")
    meter.create_observable_up_down_counter(names.GPU_MEMORY_USAGE.name, [lambda o: [Observation(40 * 2**30, gpu)]], unit="By")
    t0 = time.time()
    with flushing(vm):
        time.sleep(2.5)
        provider.shutdown()
        time.sleep(1.0)
    obj = O.PromObjective(PromClient(vm.url), warmup=0, selector=f'host_name="{host}"')
    stats = O.StepStats(0.1, 10, 10, window=(t0 + 0.5, time.time()))
    ev = obj.evidence(stats)
    assert ev["sm_activity"] == pytest.approx(0.28)
    assert ev["gpu_memory_peak_bytes"] == 40 * 2**30
    assert ev["nvlink_bytes_per_s"] is None and ev["ib_bytes_per_s"] is None
