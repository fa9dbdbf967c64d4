"""The straggler and communication rules on GPU-timed (NCCL) collective time, on synthetic jobs whose
truth is known: 2, 8 and 64 ranks, the straggler on different ranks and in different places of the
step, with and without communication overlapped with compute; a clean job shows nothing above info."""
from __future__ import annotations

import pytest

from otel_gpu.diagnose.comm import comm_bound
from otel_gpu.diagnose.straggler import straggler
from otel_gpu.diagnose.thresholds import Thresholds
from tests.training.fr_synth import Job, simulate, window

TH = Thresholds()
CASES = [  # ranks, straggler, place in the step (segment index; 3 = after the last collective), overlap
    (2, 1, 0, False), (2, 0, 3, True), (8, 5, 1, False), (8, 2, 2, True), (64, 37, 0, True), (64, 0, 3, False),
]


@pytest.mark.parametrize("ranks, late, place, overlap", CASES)
def test_the_rank_the_others_wait_for_is_named_with_what_they_lose(ranks, late, place, overlap):
    job = Job(ranks=ranks, steps=40, straggler=late, extra_s=0.008, place=place, overlap=overlap, seed=ranks + place)
    res = simulate(job)
    (f,) = straggler(window(res), TH)
    assert f.rule == "straggler" and f.where["ranks"] == [str(late)] and f.severity in ("warning", "critical"), f
    # what the others wait per step for it: the injected extra without overlap; with overlap the late rank holds up
    # each later collective of the step as well, so the GPU-timed excess is an upper bound (said in the finding)
    if overlap:
        assert job.extra_s * 0.9 <= f.evidence["lateness_s"] <= len(job.comm_s) * job.extra_s * 1.1
        assert "upper bound" in f.seen and "upper bound" in f.basis
    else:
        assert f.evidence["lateness_s"] == pytest.approx(job.extra_s, rel=0.1)
    assert f.evidence["collective_basis"] == "gpu" and f.evidence["arrived_last_share"] == 1.0
    truth = sum(sum(res.coll_s[r]) - sum(res.coll_s[late]) for r in range(ranks) if r != late)
    assert f.lost_s == pytest.approx(truth, rel=0.02)
    assert "NCCL" in f.title and "arrived last" in f.seen


@pytest.mark.parametrize("overlap", [False, True])
def test_communication_itself_is_measured_without_the_stragglers_wait(overlap):
    job = Job(ranks=8, steps=40, straggler=3, extra_s=0.02, overlap=overlap, comm_s=(0.01, 0.01, 0.012))
    res = simulate(job)
    w = window(res)
    (f,) = comm_bound(w, TH)
    step = sum(res.step_s[0]) / job.steps
    assert f.rule == "comm" and f.evidence["comm_per_step_s"] == pytest.approx(sum(job.comm_s), rel=0.02)
    assert f.lost_share == pytest.approx(sum(job.comm_s) / step, rel=0.02)
    assert f.evidence["by_kind_s"] == pytest.approx({"all_gather": 0.02, "reduce_scatter": 0.012}, rel=0.02)
    assert f.evidence["zero"] and "parameter fetch (all-gather)" in f.seen and "gradient reduce (reduce-scatter)" in f.seen
    assert f.severity == "warning" and f.evidence["exposure"] == "not measured" and "not measured" in f.seen


@pytest.mark.parametrize("ranks", [2, 8, 64])
def test_a_clean_job_shows_nothing_above_info(ranks):
    res = simulate(Job(ranks=ranks, steps=40, seed=ranks, comm_s=(0.002, 0.002, 0.003)))
    w = window(res)
    assert [f for f in straggler(w, TH) + comm_bound(w, TH) if f.severity != "info"] == []


def test_where_the_stragglers_time_went_from_its_host_phases():
    res = simulate(Job(ranks=4, steps=40, straggler=2, extra_s=0.01, place=0))
    phases = {r: {"data_wait": 0.002 * 40 + (0.01 * 40 if r == 2 else 0.0), "forward": 0.01 * 40} for r in range(4)}
    (f,) = straggler(window(res, phases=phases), TH)
    assert f.evidence["phase"] == "data_wait" and "data wait grew" in f.title and "input pipeline" in f.action


def test_gpu_work_that_no_host_phase_shows_is_said_so():
    (f,) = straggler(window(simulate(Job(ranks=4, steps=40, straggler=1, extra_s=0.01, place=1))), TH)
    assert f.evidence["phase"] is None and "GPU work" in f.seen and "kernels" in f.action


def test_a_straggler_that_moves_between_ranks_is_no_straggler():
    a = simulate(Job(ranks=2, steps=20, straggler=0, extra_s=0.01, seed=1))
    b = simulate(Job(ranks=2, steps=20, straggler=1, extra_s=0.03, seed=2))
    for r in (0, 1):   # first half rank 0 is late, second half rank 1
        a.entries[r] += [{**e, "record_id": e["record_id"] + 10_000} for e in b.entries[r]]
        a.step_s[r] += b.step_s[r]
        a.coll_s[r] += b.coll_s[r]
    (f,) = straggler(window(a), TH)
    assert f.severity == "info" and "no consistent straggler" in f.title


def test_host_and_gpu_seconds_are_never_compared():
    w = window(simulate(Job(ranks=2, steps=10)))
    w.ranks[1].collective_basis = "host"
    for rule in (straggler, comm_bound):
        (f,) = rule(w, TH)
        assert f.severity == "info" and f.missing == ["comparable collective time"] and "host: rank 1)" in f.action
    w = window(simulate(Job(ranks=4, steps=10)))
    for r in w.ranks[1:]:
        r.collective_basis = "host"
    (f,) = straggler(w, TH)
    assert "host: ranks 1-3)" in f.action and "rank(s)" not in f.action


def test_unmeasured_ranks_say_why():
    w = window(simulate(Job(ranks=2, steps=10)))
    for r in w.ranks:
        r.collective_s, r.collective_basis = None, ""
        r.collective_unmeasured = {"max_connections_1": 1.0}
    for rule in (straggler, comm_bound):
        (f,) = rule(w, TH)
        assert "not checked" in f.title and "CUDA_DEVICE_MAX_CONNECTIONS=1" in f.action, f.action
        assert "ranks 0-1: " in f.action and "rank(s)" not in f.action, f.action
