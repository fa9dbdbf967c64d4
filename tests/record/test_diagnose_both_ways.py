"""One real run recorded and, at the same time, exported to VictoriaMetrics (the recorder forwards
every body): `diagnose RUN_DIR` finds what `diagnose --prometheus` finds over the same window."""
from __future__ import annotations

import uuid

import pytest

from tests.childenv import clean_env

from .conftest import REPO, diagnosed_both_ways, record, torchrun

pytestmark = pytest.mark.slow
CPU_TRAIN = REPO / "tests" / "diagnose" / "cpu_train.py"


def test_recorded_and_prometheus_findings_agree(victoriametrics, tmp_path):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    vm = victoriametrics
    job = f"both-{uuid.uuid4().hex[:8]}"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    # an input-bound loop with checkpoints, 2 ranks; no profiles (the Prometheus side has no Pyroscope here)
    r = record(tmp_path / "run", torchrun(CPU_TRAIN, str(tmp_path / "truth.json"), "--steps", "160", "--loader-ms", "25",
                                          "--ckpt-every", "40", "--ckpt-mb", "32", "--ckpt-dir", str(tmp_path)),
               "--job", job, "--no-profile", "--agent-arg=--fake-gpus=2", env=env, cwd=tmp_path)
    assert r.proc.returncode == 0, r.proc.stderr[-3000:]
    recorded, served = diagnosed_both_ways(vm, r.directory, job)
    w = recorded.window
    mine = [(f.rule, f.severity) for f in recorded.findings]
    theirs = [(f.rule, f.severity) for f in served.findings]
    assert mine == theirs, (recorded.as_dict()["findings"], served.as_dict()["findings"])
    assert {"input", "checkpoint"} <= {rule for rule, _ in mine}, mine
    assert [r.rank for r in w.ranks] == [r.rank for r in served.window.ranks] == ["0", "1"]
    for a, b in zip(w.ranks, served.window.ranks):
        assert a.steps == b.steps and a.phases.keys() == b.phases.keys()
        assert a.phases["data_wait"] == pytest.approx(b.phases["data_wait"], rel=1e-6)
        assert a.collective_s == pytest.approx(b.collective_s, rel=1e-6) and a.collective_s > 0
        assert a.collective_by_kind.keys() == b.collective_by_kind.keys()
        assert a.saves == b.saves and len(a.save_ranges) == len(b.save_ranges)
    assert w.busy.keys() == served.window.busy.keys() == {"0", "1"}
    # GPU numbers over the same training time (the first step to the last), GPM tensor/DRAM/occupancy included
    s = served.window
    assert w.train_start == pytest.approx(s.train_start, abs=w.interval_s) and w.train_start > w.start + 1.0
    assert w.train_end == pytest.approx(s.train_end, abs=w.interval_s)
    assert [g.name for g in w.gpus] == [g.name for g in s.gpus] and len(w.gpus) == 2
    for a, b in zip(w.gpus, s.gpus):
        for key in ("util", "sm", "tensor", "dram", "occupancy"):
            assert getattr(a, key) is not None and getattr(a, key) == pytest.approx(getattr(b, key), abs=0.03), key
    # the job's own processes' CPU (the input rule's evidence): the rank, its workers, torchrun
    (a,), (b,) = w.nodes, s.nodes
    assert a.cpus == b.cpus and a.cpus >= 1 and a.job_cpu is not None and b.job_cpu is not None, (a, b)
    assert 0 < a.job_cpu == pytest.approx(b.job_cpu, abs=0.05), (a.job_cpu, b.job_cpu)
    for f, g in zip(recorded.findings, served.findings):
        if f.lost_share is not None and g.lost_share is not None:
            assert f.lost_share == pytest.approx(g.lost_share, abs=0.03), (f.rule, f.lost_share, g.lost_share)
