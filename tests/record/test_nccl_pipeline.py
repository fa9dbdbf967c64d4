"""The GPU-basis rules through the real pipeline: recorded runs whose ranks feed synthetic per-rank
NCCL Flight Recorder series (tests/training/fr_synth.py) to the real poller, exported by the real
session to the recorder, which forwards every body to VictoriaMetrics; each run is diagnosed from
the recording and from VictoriaMetrics alike, and both name the injected straggler.

Three runs go side by side (their ranks mostly sleep): 2 ranks with rank 1 late, 4 ranks with
rank 0 late, 2 ranks with no straggler.
"""
from __future__ import annotations

import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_gpu.diagnose import diagnose
from otel_gpu.promql import PromClient
from otel_gpu.record.diagnose import diagnose_recording
from tests.childenv import clean_env
from tests.servers import free_port

from .conftest import HERE, RecordedRun, record

pytestmark = pytest.mark.slow
RANK = HERE / "nccl_synth_rank.py"
STEPS = 110          # about 0.09 s each with the straggler: ~10 s a run
EXTRA_MS = 20.0      # the straggler's extra compute per step: ~22% of the step, above the critical share
CASES = {            # name -> (world, straggler rank or -1)
    "2r-late1": (2, 1),
    "4r-late0": (4, 0),
    "2r-clean": (2, -1),
}


@dataclass
class Case:
    job: str
    world: int
    straggler: int
    run: RecordedRun
    truth: Path


def _record(vm, tmp: Path, name: str, world: int, straggler: int) -> Case:
    job = f"nccl-{name}-{uuid.uuid4().hex[:6]}"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    truth = tmp / f"{name}.truth.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
           "--master_port", str(free_port()), str(RANK), str(truth), "--steps", str(STEPS),
           "--straggler", str(straggler), "--extra-ms", str(EXTRA_MS if straggler >= 0 else 0.0)]
    run = record(tmp / name, cmd, "--job", job, "--no-profile", f"--agent-arg=--fake-gpus={world}", env=env, cwd=tmp)
    return Case(job, world, straggler, run, truth)


@pytest.fixture(scope="module")
def runs(victoriametrics, tmp_path_factory) -> dict[str, Case]:
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]'): the ranks run under torchrun")
    tmp = tmp_path_factory.mktemp("nccl")
    with ThreadPoolExecutor(len(CASES)) as pool:
        futures = {name: pool.submit(_record, victoriametrics, tmp, name, *spec) for name, spec in CASES.items()}
        out = {name: f.result() for name, f in futures.items()}
    for c in out.values():
        assert c.run.proc.returncode == 0, c.run.proc.stderr[-3000:]
    victoriametrics.flush()
    time.sleep(1.0)
    victoriametrics.flush()
    return out


def _both(vm, case: Case):
    recorded = diagnose_recording([case.run.directory])
    w = recorded.window
    with PromClient(vm.url) as client:
        served = diagnose(client, case.job, w.start, w.end)
    return recorded, served


def _findings(report) -> list[tuple[str, str]]:
    return [(f.rule, f.severity) for f in report.findings]


@pytest.mark.parametrize("name", [n for n, (_, late) in CASES.items() if late >= 0])
def test_straggler_named_from_recording_and_victoriametrics(runs, victoriametrics, name):
    case = runs[name]
    recorded, served = _both(victoriametrics, case)
    ranks = [str(r) for r in range(case.world)]
    for report in (recorded, served):
        w = report.window
        assert [r.rank for r in w.ranks] == ranks, report.queries
        assert [r.collective_basis for r in w.ranks] == ["gpu"] * case.world, [(r.rank, r.collective_basis) for r in w.ranks]
        for r in w.ranks:
            assert {"all_gather", "reduce_scatter"} <= r.collective_by_kind.keys(), (r.rank, r.collective_by_kind)
            assert not r.collective_unmeasured, (r.rank, r.collective_unmeasured)
        late = [f for f in report.findings if f.rule == "straggler"]
        assert len(late) == 1, report.as_dict()["findings"]
        f = late[0]
        assert f.severity in ("warning", "critical"), (f.title, f.evidence)
        assert f.where["ranks"] == [str(case.straggler)], (f.title, f.evidence)
        assert f.evidence["collective_basis"] == "gpu"
        assert f.evidence["lateness_s"] == pytest.approx(EXTRA_MS / 1000, rel=0.2), (f.title, f.evidence)
    assert _findings(recorded) == _findings(served), (recorded.as_dict()["findings"], served.as_dict()["findings"])
    for a, b in zip(recorded.window.ranks, served.window.ranks):
        assert a.steps == b.steps
        assert a.collective_s == pytest.approx(b.collective_s, rel=1e-6) and a.collective_s > 0
        assert a.collective_by_kind.keys() == b.collective_by_kind.keys()


def test_clean_run_has_no_straggler(runs, victoriametrics):
    case = runs["2r-clean"]
    recorded, served = _both(victoriametrics, case)
    for report in (recorded, served):
        assert [r.collective_basis for r in report.window.ranks] == ["gpu"] * case.world
        loud = [f for f in report.findings if f.rule == "straggler" and f.severity != "info"]
        assert not loud, [(f.title, f.severity, f.evidence) for f in loud]
        # the ranks' GPU collective time per step is the same within noise
        per_step = [r.collective_s / r.step_count for r in report.window.ranks]
        assert max(per_step) - min(per_step) < 0.2 * statistics.median(per_step), per_step
    assert _findings(recorded) == _findings(served), (recorded.as_dict()["findings"], served.as_dict()["findings"])
