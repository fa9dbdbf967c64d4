"""Real hangs: 2-rank gloo jobs (no otel-gpu code, tests/record/hang_job.py) under `otel-gpu run --record`
in which the rank the test picks stops before a collective mid-run while the other blocks in it. The
rules, run over the recording while it is still written, name exactly the stopped rank (and nothing
before it stopped); one job is also forwarded to VictoriaMetrics, where `diagnose` over a window
ending now names the same rank from the same numbers; then every rank is asked for its Python
stacks, and the stopped rank's names the frame it sleeps in. Two jobs run side by side (rank 0 stops
in one, rank 1 in the other, each at a step drawn by the test); every process they started is ended
when the test ends."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from otel_gpu.diagnose import diagnose, run_rules
from otel_gpu.diagnose.findings import Finding
from otel_gpu.diagnose.model import DiagnoseError
from otel_gpu.diagnose.thresholds import Thresholds
from otel_gpu.promql import PromClient
from otel_gpu.record.reader import Recording, RecordingError
from otel_gpu.record.window import recorded_window
from otel_gpu.stacks import latest, request_stacks
from tests.childenv import clean_env

from .conftest import HERE, REPO, RUN, torchrun

pytestmark = pytest.mark.slow
LIMIT_S = 3.0                                    # the stall limit for these short jobs (steps are ~30-60 ms)
TH = Thresholds({"stall": {"min_s": LIMIT_S}})
START_TIMEOUT_S = 150                            # torch imports of 3 processes per job on 2 shared cores
FOUND_WITHIN_S = 30                              # after the stop: limit + export interval + reading, with room


@dataclass
class Hang:
    stop_rank: int
    stop_step: int
    directory: Path
    truth: Path
    log: Path
    proc: subprocess.Popen
    job: str
    vm: object = None      # the VictoriaMetrics the recording forwards to, if any


def _start(tmp: Path, stop_rank: int, stop_step: int, vm=None) -> Hang:
    name, job = f"stop{stop_rank}", f"hang-{uuid.uuid4().hex[:8]}"
    d, truth, log = tmp / name, tmp / f"{name}.truth.json", tmp / f"{name}.stderr"
    cmd = RUN + ["--record", str(d), "--job", job, "--no-agent", "--no-profile", "--no-report", "--grace", "2", "--",
                 *torchrun(HERE / "hang_job.py", str(stop_rank), str(stop_step), str(truth))]
    env = clean_env()
    if vm is not None:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
    return Hang(stop_rank, stop_step, d, truth, log, proc, job, vm)


def _stalls(d: Path) -> list[Finding] | None:
    """The stall findings of the recording so far (a window ending at its newest point); None while it
    holds no step yet."""
    try:
        with Recording.open([d]) as rec:
            w = recorded_window(rec, with_profile=False)
    except (DiagnoseError, RecordingError):
        return None
    return [f for f in run_rules(w, TH) if f.rule == "stall"]


def _end(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each `otel-gpu run` (it ends the command), then SIGKILL whatever they started that is left."""
    started = []
    for p in procs:
        try:
            started += psutil.Process(p.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    _, alive = psutil.wait_procs(started, timeout=5)
    for c in alive:
        try:
            os.kill(c.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_hang_is_named_by_the_rank_that_stopped_with_its_stack(tmp_path, victoriametrics):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    forwarded = rnd.randrange(2)   # which of the two jobs VictoriaMetrics gets too
    jobs = [_start(tmp_path, rank, rnd.randrange(60, 120), victoriametrics if rank == forwarded else None)
            for rank in (0, 1)]
    try:
        _until_both_stopped(jobs, seed)
        for job in jobs:
            _check(job, seed)
    finally:
        _end([j.proc for j in jobs])
    for job in jobs:
        assert job.proc.returncode != 0   # killed, not finished


def _until_both_stopped(jobs: list[Hang], seed: int) -> None:
    """Wait for each job's stop, diagnosing its recording meanwhile: no stall while it trains, nor just
    after it stopped (within the limit)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    clean = {id(j): 0 for j in jobs}
    waiting = list(jobs)
    while waiting:
        for job in list(waiting):
            what = f"rank {job.stop_rank} stops at step {job.stop_step} (seed {seed})"
            assert job.proc.poll() is None, f"{what}: the run ended early: {job.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{what}: never got there: {job.log.read_text()[-3000:]}"
            stopped = job.truth.exists()
            found = _stalls(job.directory)
            if found is not None and (not stopped or time.time() - json.loads(job.truth.read_text())["t"] < LIMIT_S):
                assert found == [], f"{what}: a stall before the limit: {found[0].seen}"
                clean[id(job)] += 1
            if stopped:
                waiting.remove(job)
        time.sleep(0.5)
    assert all(clean.values()), "no window was diagnosed while the jobs trained"


def _check(job: Hang, seed: int) -> None:
    what = f"rank {job.stop_rank} stopped at step {job.stop_step} (seed {seed})"
    truth = json.loads(job.truth.read_text())
    assert truth["rank"] == job.stop_rank and truth["step"] == job.stop_step
    found: list[Finding] = []
    while not found:
        assert time.time() - truth["t"] < FOUND_WITHIN_S, f"{what}: no stall finding after {FOUND_WITHIN_S} s"
        time.sleep(0.5)
        found = _stalls(job.directory) or []
    after = time.time() - truth["t"]
    (f,) = found
    print(f"{what}: stall named {after:.1f} s after the stop: {f.title}")
    assert f.where["ranks"] == [str(job.stop_rank)], f"{what}: named {f.where} ({f.seen})"
    assert f.severity == "critical" and f.confidence == "high" and f.evidence["attribution"] == "host_waits"
    assert LIMIT_S <= after < FOUND_WITHIN_S
    # since when: the last step of either rank, just before the stop (the other rank may finish one more)
    assert truth["t"] - 2.0 <= f.evidence["since"] <= truth["t"] + 1.0, (f.evidence["since"], truth["t"])
    waiting = f.evidence["waiting"]
    assert list(waiting) == [str(1 - job.stop_rank)] and waiting[str(1 - job.stop_rank)]["collective"] == "ddp_allreduce"
    if job.vm is not None:
        _check_promql(job, f, what)
    # the stacks at that moment: the stopped rank sleeps in the script's own function, the other does not
    paths = request_stacks(job.directory / "stacks")
    assert [p.name.split("-")[0] for p in paths] == ["rank0", "rank1"], paths
    dumps = {int(p.name.split("-")[0][4:]): latest(p) for p in paths}
    assert "in stopped_before_the_collective" in dumps[job.stop_rank], dumps[job.stop_rank]
    other = dumps[1 - job.stop_rank]
    assert "stopped_before_the_collective" not in other and "wait_for_buckets" in other, other


def _check_promql(job: Hang, recorded: Finding, what: str) -> None:
    """`diagnose` against VictoriaMetrics, over the last two minutes up to now: the same stall, from the
    same per-rank numbers (PromQL's rank_summary against the recording's)."""
    job.vm.flush()
    with PromClient(job.vm.url) as client:
        report = diagnose(client, job.job, time.time() - 120, time.time(), thresholds=TH)
    (f,) = [x for x in report.findings if x.rule == "stall"]
    assert f.where["ranks"] == [str(job.stop_rank)] and f.confidence == "high", f"{what}: PromQL named {f.where}"
    print(f"{what}: VictoriaMetrics: {f.title}")
    assert f.evidence["since"] == pytest.approx(recorded.evidence["since"], abs=1e-3)
    assert f.evidence["last_step"] == recorded.evidence["last_step"]
    assert list(f.evidence["waiting"]) == list(recorded.evidence["waiting"])
    for rank, theirs in f.evidence["ranks"].items():
        mine = recorded.evidence["ranks"][rank]
        assert theirs["steps"] == mine["steps"] and theirs["step_last"] == pytest.approx(mine["step_last"], abs=1e-3)
        assert set(theirs["collective_open"]) == set(mine["collective_open"]) == {"ddp_allreduce"}
