"""Evaluation passes of jobs nobody instrumented by hand, diagnosed both ways: a plain DDP loop (2 ranks,
gloo, CPU) evaluating under `model.eval()` + `no_grad` or under `inference_mode`, after different steps
with different amounts of work, and the HF Trainer with eval_strategy="steps". Each run is recorded
with `otel-gpu run` while its bodies go on to VictoriaMetrics; `diagnose RUN_DIR` and the PromQL
diagnosis must both find evaluation's share within 5 points of what each rank measured itself, name
no straggler, and count the training steps without the evaluation in them."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from otel_gpu.diagnose import diagnose
from otel_gpu.promql import PromClient
from otel_gpu.record.diagnose import diagnose_recording
from tests.childenv import clean_env
from tests.record.conftest import REPO, record, torchrun

pytestmark = pytest.mark.slow
JOBS = REPO / "tests" / "diagnose" / "jobs"
# case -> (script, flags, steps counted: the optimizer driver's first step only opens the count)
CASES = {
    "ddp-3-passes": ("eval_ddp.py", ["--steps", "80", "--eval-at", "20,40,60", "--eval-batches", "24"], 79),
    "ddp-2-passes-inference": ("eval_ddp.py", ["--steps", "80", "--eval-at", "12,55", "--eval-batches", "8",
                                               "--how", "inference_mode"], 79),
    "hf-steps": ("eval_hf.py", ["--steps", "90", "--eval-steps", "15"], 90),
}
SHARE_TOLERANCE = 0.05


def explain(report) -> str:
    rows = [f"rank {r.rank}: steps {r.steps}, step {r.mean_step_s}, wall {report.window.rank_wall_s(r):.3f}, "
            f"phases {r.phases}, waits {r.collective_by_phase}" for r in report.window.ranks]
    return "; ".join(rows) + f"; findings {[(f.rule, f.severity, f.title) for f in report.findings]}"


def run_both_ways(vm, tmp_path, name: str, cmd: list[str]):
    """Run `cmd` (a torchrun of a job writing truth{rank}.json into tmp_path) under `otel-gpu run`, its
    bodies going on to VictoriaMetrics too: (truth by rank, the recording's report, the PromQL report)."""
    job = f"{name}-{uuid.uuid4().hex[:6]}"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                    OTEL_METRIC_EXPORT_INTERVAL="500")
    r = record(tmp_path / "run", cmd, "--job", job, "--no-profile", "--no-agent", env=env, cwd=tmp_path, timeout=200)
    assert r.proc.returncode == 0, r.proc.stderr[-3000:]
    truth = {t["rank"]: t for t in (json.loads((tmp_path / f"truth{i}.json").read_text()) for i in range(2))}
    recorded = diagnose_recording([r.directory])
    vm.flush()
    time.sleep(1.0)
    vm.flush()
    with PromClient(vm.url) as client:
        served = diagnose(client, job, recorded.window.start, recorded.window.end)
    return truth, recorded, served


def eval_shares(report, truth: dict, way: str, steps: int):
    """The report's one eval finding, its share per rank within SHARE_TOLERANCE of what each rank
    measured, and every rank's steps counted as trained, none holding a pass: (finding, share by rank)."""
    [f] = [x for x in report.findings if x.rule == "eval"]
    per = f.evidence["per_rank_share"]
    for k, t in truth.items():
        assert per[k] == pytest.approx(t["eval_share"], abs=SHARE_TOLERANCE), (way, per, truth, explain(report))
    for rank in report.window.ranks:
        t = truth[rank.rank]
        assert rank.steps == steps and rank.step_count == steps, (way, explain(report))
        assert rank.mean_step_s <= 1.35 * t["train_step_s"] + 0.005, (way, rank.mean_step_s, t)
    return f, per


def ways_agree(shares: dict, truth: dict) -> None:
    """The recording's and the PromQL diagnosis' shares per rank within 3 points of each other."""
    for k in truth:
        assert shares["recording"][k] == pytest.approx(shares["prometheus"][k], abs=0.03)


@pytest.mark.parametrize("case", list(CASES))
def test_evaluation_share_as_measured_and_nothing_else_named(victoriametrics, tmp_path, case):
    script, flags, counted = CASES[case]
    if script == "eval_hf.py":
        pytest.importorskip("transformers", reason="transformers not installed (otel-gpu[train])")
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    extra = [str(tmp_path / "out")] if script == "eval_hf.py" else []
    truth, recorded, served = run_both_ways(
        victoriametrics, tmp_path, case, torchrun(JOBS / script, str(tmp_path / "truth{rank}.json"), *extra, *flags))
    shares = {}
    for way, report in (("recording", recorded), ("prometheus", served)):
        f, per = eval_shares(report, truth, way, counted)   # the steps as trained, none added, no pass in any
        shares[way] = per
        assert f.lost_share == pytest.approx(max(per.values()), abs=1e-4) and f.severity in ("warning", "critical"), (way, f.severity)
        assert "less often" in f.action and "fewer batches" in f.action and "asynchronously" in f.action
        assert not [x for x in report.findings if x.rule == "straggler" and x.severity != "info"], (way, explain(report))
    print(f"{case}: eval share per rank, recording {shares['recording']}, prometheus {shares['prometheus']}, "
          f"measured { {k: round(t['eval_share'], 4) for k, t in truth.items()} }")
    ways_agree(shares, truth)
