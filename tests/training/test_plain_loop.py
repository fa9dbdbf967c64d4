"""A real PyTorch loop on CPU, two ranks, read back per rank and phase from VictoriaMetrics."""
import subprocess
import sys

import pytest

from conftest import HERE, REPO, otlp_env, query_until, unique_job

from otel_gpu.names import STEP_BUCKETS

pytestmark = pytest.mark.slow
STEPS = 30


def test_plain_loop_metrics_per_rank_and_phase(victoriametrics, torch_mod, tmp_path):
    vm, job = victoriametrics, unique_job("plain")
    procs = []
    for rank in (0, 1):
        # exports every 0.3 s over a run of about 1.7 s: rate() needs two samples after the checkpoint
        env = otlp_env(vm, job, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", OTEL_METRIC_EXPORT_INTERVAL="300")
        procs.append(subprocess.Popen([sys.executable, str(HERE / "plain_loop.py"), str(STEPS),
                                       str(tmp_path / f"ck{rank}.pt"), "0.3", "0.04"],
                                      env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "finished" in out

    sel = f'otelgpu_job="{job}"'
    steps = query_until(vm, f"otelgpu_train_steps_total{{{sel}}}", 2)
    assert {s.labels["otelgpu_rank"]: s.value for s in steps} == {"0": STEPS, "1": STEPS}
    assert all(s.labels["otelgpu_world_size"] == "2" and s.labels["host_name"] for s in steps)
    assert {s.labels["otelgpu_local_rank"] for s in steps} == {"0", "1"}

    phases = query_until(vm, f'otelgpu_train_phase_time_seconds_total{{{sel},otelgpu_rank="1"}}', 5)
    by_phase = {s.labels["otelgpu_phase"]: s.value for s in phases}
    assert set(by_phase) == {"data_wait", "forward", "backward", "optimizer", "checkpoint"}
    assert 0.3 <= by_phase["checkpoint"] < 5
    assert all(v > 0 for v in by_phase.values())

    # the step histogram: buckets in seconds, every step counted, the sum covers the phases inside steps
    count = query_until(vm, f'otelgpu_train_step_duration_seconds_count{{{sel},otelgpu_rank="0"}}', 1)
    assert count[0].value == STEPS
    le = query_until(vm, f'otelgpu_train_step_duration_seconds_bucket{{{sel},otelgpu_rank="0"}}', len(STEP_BUCKETS) + 1)
    assert {float(s.labels["le"]) for s in le} == {*STEP_BUCKETS, float("inf")}
    total = query_until(vm, f'otelgpu_train_step_duration_seconds_sum{{{sel},otelgpu_rank="0"}}', 1)[0].value
    phases0 = query_until(vm, f'otelgpu_train_phase_time_seconds_total{{{sel},otelgpu_rank="0"}}', 5)
    inside = sum(s.value for s in phases0 if s.labels["otelgpu_phase"] != "checkpoint")
    assert inside <= total < 60   # phases inside steps cannot add up to more than the steps

    samples = query_until(vm, f"otelgpu_train_samples_total{{{sel}}}", 2)
    assert sorted(s.value for s in samples) == [8 * STEPS, 8 * STEPS]
    tokens = query_until(vm, f"sum(otelgpu_train_tokens_total{{{sel}}})", 1)
    assert tokens[0].value == 2 * 8 * 16 * STEPS
    ckpt = query_until(vm, f'otelgpu_train_checkpoints_total{{{sel},otelgpu_rank="0"}}', 2)
    assert {s.labels["otelgpu_checkpoint_event"]: s.value for s in ckpt} == {"start": 1, "end": 1}

    # every PromQL example in docs/training.md answers on this data
    queries = {k: q.replace('"J"', f'"{job}"') for k, q in doc_queries().items()}
    assert len(queries) == 6
    want = {"median step time": 2, "share of wall time": 10, "job throughput": 1, "stragglers": 2}
    for key, n in want.items():
        (expr,) = [q for k, q in queries.items() if key in k]
        result = query_until(vm, expr, n)
        assert len(result) == n and all(s.value >= 0 for s in result), (expr, result)
        assert sum(s.value for s in result) > 0, expr
    for key in ("checkpoint in progress", "join with the node agent"):   # none in progress; no agent for this job (the shared VM holds other tests' agents)
        (expr,) = [q for k, q in queries.items() if key in k]
        assert query_until(vm, expr, 1, timeout=0) == [], expr


def doc_queries():
    """The PromQL examples of docs/training.md, comment -> query (continuation lines joined)."""
    text = (REPO / "docs" / "training.md").read_text()
    block = text.split("```promql\n", 1)[1].split("```", 1)[0]
    out, comment = {}, None
    for line in block.splitlines():
        if line.startswith("#"):
            comment = line[1:].strip()
        elif line.strip():
            out[comment] = (out.get(comment, "") + " " + line.strip()).strip()
    return out

