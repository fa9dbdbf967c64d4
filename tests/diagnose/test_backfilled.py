"""Diagnosis of fixed series in a real Prometheus: a synthetic job with known problems, a clean one,
and GPU series played back from real nvidia-smi captures."""
from __future__ import annotations

import json

import pytest

from otel_gpu.cli import main
from otel_gpu.diagnose import diagnose
from otel_gpu.promql import PromClient

from .smi import needs_captures

pytestmark = pytest.mark.slow


def by_rule(report):
    out = {}
    for f in report.findings:
        out.setdefault(f.rule, []).append(f)
    return out


def test_synthetic_job_findings_match_the_injected_truth(backfilled):
    job = backfilled.synth
    truth = job.truth()
    with PromClient(backfilled.prometheus.url) as client:
        report = diagnose(client, job.job, job.start, job.end)
    assert report.queries["queries"] == 5          # ranks, GPUs, nodes, one timeline, busy time per rank
    w = report.window
    assert (len(w.ranks), len(w.gpus), len(w.nodes)) == (8, 8, 2)
    assert w.interval_s == pytest.approx(5.0, abs=0.05)
    found = by_rule(report)

    (ck,) = found["checkpoint"]
    assert ck.evidence["share"] == pytest.approx(truth["checkpoint_share"], abs=0.003)
    assert ck.evidence["saves"] == 5 and ck.evidence["every_s"] == pytest.approx(600, abs=10)
    assert ck.evidence["disk_write_Bps_during"] > 100 * ck.evidence["disk_write_Bps_outside"]

    (st,) = found["straggler"]
    assert st.where == {"ranks": [str(truth["straggler"])], "nodes": [truth["straggler_host"]]}
    assert st.evidence["lateness_s"] == pytest.approx(job.straggler_extra, rel=0.02)
    assert st.evidence["phase"] == "forward" and st.evidence["consistency"] >= 0.9
    causes = " ".join(st.evidence["candidate_causes"])
    assert "hw_thermal_slowdown" in causes and "InfiniBand port errors on node-01" in causes

    (sm,) = found["sm_idle"]
    assert sm.severity == "critical" and sm.evidence["gpus_flagged"] == 8
    (per,) = found["periodic"]
    assert per.evidence["period_s"] == pytest.approx(truth["period_s"], abs=10)
    assert per.evidence["matched_phase"] == "checkpoint"
    (th,) = found["throttle"]
    assert th.where["gpus"] == ["node-01/gpu1"] and th.where["ranks"] == ["5"]
    assert "comm" not in found          # every rank waits 4% of its step in all-reduce: below the threshold
    missing = [bool(f.missing) for f in report.findings]
    assert missing == sorted(missing)   # what could not be checked is listed last


def test_clean_job_has_nothing_above_info(backfilled):
    job = backfilled.clean
    with PromClient(backfilled.prometheus.url) as client:
        report = diagnose(client, job.job, job.start, job.end)
    assert len(report.window.ranks) == 8
    assert all(f.severity == "info" for f in report.findings), [(f.severity, f.title) for f in report.findings]


@needs_captures
def test_nvidia_smi_captures_gpu_only(backfilled, tmp_path, capsys):
    b = backfilled
    out = tmp_path / "smi.json"
    rc = main(["diagnose", "--prometheus", b.prometheus.url, "--job", b.smi_job, "--from", str(b.smi_start),
               "--to", str(b.smi_end), "--gpu-only", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    d = json.loads(out.read_text())
    assert (d["ranks"], d["gpus"], d["nodes"]) == (0, 3, 0)
    rules = {f["rule"]: f for f in d["findings"]}
    # the captures have no GPM: the SM rule says so instead of guessing
    assert rules["sm_idle"]["missing"] == ["otelgpu_gpu_sm_activity"]
    # real clock-event masks: idle only while idle, nothing throttling under load
    assert "throttle" not in rules
    per = rules["periodic"]
    assert per["evidence"]["signal"] == "GPU utilization"
    assert per["evidence"]["period_s"] == pytest.approx(70, abs=3)
    assert per["evidence"]["matched_phase"] is None and per["severity"] != "info"
    assert per["evidence"]["drops"] >= 20


@needs_captures
def test_gpu_series_without_step_metrics_is_refused(backfilled, capsys):
    b = backfilled
    rc = main(["diagnose", "--prometheus", b.prometheus.url, "--job", b.smi_job, "--from", str(b.smi_start),
               "--to", str(b.smi_end)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    assert "no step metrics for job 'smi'" in err and "--gpu-only" in err
