"""Real training runs on CPU with a known bottleneck, telemetry over OTLP into VictoriaMetrics,
diagnosed from there; each run measures its own truth."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from otel_gpu.diagnose import diagnose
from otel_gpu.promql import PromClient
from tests.childenv import clean_env
from tests.servers import free_port

pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("cpu_train.py")


def train(vm, tmp_path: Path, *args: str, world: int = 1, agent: bool = False) -> tuple[str, list[dict], float, float]:
    """Run cpu_train.py (`world` ranks), optionally beside the node agent; (job, truths, start, end)."""
    job = f"cpu-{uuid.uuid4().hex[:8]}"
    base = dict(OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                OTEL_METRIC_EXPORT_INTERVAL="500", OTELGPU_JOB=job)
    start = time.time()
    agent_proc = None
    if agent:
        agent_proc = subprocess.Popen([sys.executable, "-m", "otel_gpu", "agent", "--no-live", "--no-gpu", "--interval", "0.5",
                                       "--process", str(tmp_path)],   # the ranks: their command lines name tmp_path
                                      env=clean_env(**base), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = clean_env(**base, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path / f"truth{rank}.json"), *args],
                                      env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0 and "finished" in out, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if agent_proc is not None:
            agent_proc.terminate()
            assert agent_proc.wait(timeout=15) == 0, agent_proc.stderr.read()
    end = time.time() + 1
    vm.flush()
    time.sleep(1.0)
    vm.flush()
    truths = [json.loads((tmp_path / f"truth{r}.json").read_text()) for r in range(world)]
    return job, truths, start, end


def run_diagnose(vm, job, start, end):
    with PromClient(vm.url) as client:
        return diagnose(client, job, start, end)


def explain(report, truth) -> str:
    """The numbers behind a share, for a failure message."""
    w = report.window
    return "; ".join(f"rank {r.rank}: wall est {w.rank_wall_s(r):.3f} s, first point {r.first_t - truth['unix_start']:+.3f} s, "
                     f"last {r.last_t - truth['unix_end']:+.3f} s, phases {r.phases}" for r in w.ranks) + f"; truth {truth}"


def only(report, rule):
    found = [f for f in report.findings if f.rule == rule]
    assert len(found) == 1, [(f.rule, f.title) for f in report.findings]
    return found[0]


def test_checkpoint_share_within_3_points(victoriametrics, tmp_path):
    # long enough (~9 s) that one export interval of edge error stays well under the 3-point bar
    job, (truth,), start, end = train(victoriametrics, tmp_path, "--steps", "600", "--ckpt-every", "120",
                                      "--ckpt-mb", "128", "--ckpt-dir", str(tmp_path))
    report = run_diagnose(victoriametrics, job, start, end)
    f = only(report, "checkpoint")
    print(f"checkpoint share: diagnosed {f.evidence['share']:.4f}, measured {truth['checkpoint_share']:.4f}")
    assert abs(f.evidence["share"] - truth["checkpoint_share"]) <= 0.03, explain(report, truth)
    assert f.evidence["checkpoint_s"] == pytest.approx(truth["checkpoint_s"], rel=0.05)
    assert f.severity in ("warning", "critical") and f.where["ranks"] == ["0"]


def test_slow_data_loader_is_input_bound(victoriametrics, tmp_path):
    job, (truth,), start, end = train(victoriametrics, tmp_path, "--steps", "80", "--loader-ms", "120", agent=True)
    report = run_diagnose(victoriametrics, job, start, end)
    f = only(report, "input")
    print(f"data-wait share: diagnosed {f.lost_share:.4f}, measured {truth['data_wait_share']:.4f}")
    assert abs(f.lost_share - truth["data_wait_share"]) <= 0.03, explain(report, truth)
    assert f.severity == "critical"
    assert report.window.nodes and "the job's processes (ranks and DataLoader workers) used" in f.seen, f.seen


def test_straggler_named(victoriametrics, tmp_path):
    job, truths, start, end = train(victoriametrics, tmp_path, "--steps", "150", "--hidden", "512",
                                    "--delay-rank", "1", "--delay-ms", "40", world=2)
    report = run_diagnose(victoriametrics, job, start, end)
    f = only(report, "straggler")
    host = report.window.ranks[1].host
    assert f.where == {"ranks": ["1"], "nodes": [host]}
    assert f.evidence["phase"] == "forward"
    assert f.evidence["phase_growth_s"] == pytest.approx(truths[1]["delay_s"] / 150, rel=0.3)


def test_clean_run_nothing_above_info(victoriametrics, tmp_path):
    job, (truth,), start, end = train(victoriametrics, tmp_path, "--steps", "150")
    report = run_diagnose(victoriametrics, job, start, end)
    assert report.window.ranks and report.window.ranks[0].steps == 150
    assert all(f.severity == "info" for f in report.findings), [(f.severity, f.title) for f in report.findings]


def test_periodic_eval_matched(victoriametrics, tmp_path):
    job, (truth,), start, end = train(victoriametrics, tmp_path, "--steps", "500", "--eval-every", "100",
                                      "--eval-ms", "1500", "--min-step-ms", "30")
    report = run_diagnose(victoriametrics, job, start, end)
    ev = only(report, "eval")
    print(f"eval share: diagnosed {ev.evidence['share']:.4f}, measured {truth['eval_share']:.4f}")
    assert abs(ev.evidence["share"] - truth["eval_share"]) <= 0.03, explain(report, truth)
    assert len(ev.ranges) == 4
    per = only(report, "periodic")
    assert per.evidence["signal"] == "step rate" and per.evidence["matched_phase"] == "eval"
    # the period: one training stretch (a fifth of the training time) plus one eval
    assert per.evidence["period_s"] == pytest.approx((truth["wall_s"] - truth["eval_s"]) / 5 + truth["eval_s"] / 4, rel=0.2)
