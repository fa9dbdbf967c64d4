"""Energy per step and per token (otel_gpu/energy.py), pure: reads, resets, the rank-GPU join, the
host fallback, the job's sums, and "not checked" with its reason where a number cannot be had."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu import energy as EN
from otel_gpu import names as N
from otel_gpu.energy_read import _build


def counter(rate: float, t0: float = 0.0, t1: float = 60.0, start: float = 0.0):
    """A counter exported every second from t0 to t1, growing at `rate` a second from `start`."""
    return [(float(t), start + rate * (t - t0)) for t in range(int(t0), int(t1) + 1)]


def stale(power_w: float, period: int = 10, t1: int = 60, base: float = 1e6):
    """An energy counter read every `period` s and repeated every second in between (the agent's exports)."""
    return [(float(t), base + power_w * (t - t % period)) for t in range(0, t1 + 1)]


def test_reads_are_the_first_export_of_each_value_and_resets_count_from_zero():
    assert EN.reads([(0, 5.0), (1, 5.0), (2, 7.0), (3, 7.0), (4, float("nan")), (5, 2.0)]) == [(0, 5.0), (2, 7.0), (5, 2.0)]
    assert EN.increase([100.0, 200.0, 50.0, 150.0]) == (250.0, 1)    # reloaded at 200: 50 since, then 100 more
    assert EN.at([(0, 0.0), (10, 100.0), (20, 10.0)], 15.0) == pytest.approx(105.0)   # a restart, undone
    assert EN.at([(0, 0.0), (10, 100.0)], 11.0) is None


def test_per_gpu_join_and_job_sums():
    # GPU 0 holds rank 0 (300 W), GPU 1 rank 1 (500 W); each rank 2 steps and 4000 tokens a second
    gpus = [EN.Gpu("n", "u0", "0", stale(300.0)), EN.Gpu("n", "u1", "1", stale(500.0))]
    ranks = [EN.Rank("n", r, counter(2.0), counter(4000.0)) for r in ("0", "1")]
    rows, job = EN.per_gpu(gpus, ranks, {("n", "u0"): {"0"}, ("n", "u1"): {"1"}})
    assert [r.label for r in rows] == ["GPU 0", "GPU 1"] and [r.ranks for r in rows] == [("0",), ("1",)]
    assert rows[0].j_per_step == pytest.approx(150.0) and rows[0].j_per_token == pytest.approx(0.075)
    assert rows[1].j_per_step == pytest.approx(250.0) and rows[1].j_per_token == pytest.approx(0.125)
    assert rows[0].seconds == 60.0 and rows[0].joules == pytest.approx(18000.0)
    # the job: energy of both GPUs per (synchronous) step; all energy over all tokens
    assert job.j_per_step == pytest.approx(400.0) and job.j_per_token == pytest.approx(0.1)
    # a window: only the reads inside it
    rows, _ = EN.per_gpu(gpus, ranks, {("n", "u0"): {"0"}, ("n", "u1"): {"1"}}, lo=15.0, hi=45.0)
    assert rows[0].seconds == 20.0 and rows[0].j_per_token == pytest.approx(0.075)


def test_a_host_without_the_join_takes_its_gpus_and_ranks_together():
    gpus = [EN.Gpu("n", "u0", "0", stale(300.0)), EN.Gpu("n", "u1", "1", stale(500.0))]
    ranks = [EN.Rank("n", r, counter(2.0), counter(4000.0)) for r in ("0", "1")]
    (row,), job = EN.per_gpu(gpus, ranks, {})
    assert row.label == "GPU 0, 1" and "no GPU lists" in row.basis
    assert row.j_per_step == pytest.approx(400.0) and row.j_per_token == pytest.approx(0.1)
    assert job.j_per_token == pytest.approx(0.1) and job.j_per_step == pytest.approx(400.0)


def test_a_driver_reload_is_a_reset_not_a_negative_energy():
    # the driver reloads at t=30: the reads from then on count from 0 again (0 J at 31-39, 3000 J at 40, ...)
    energy = stale(300.0)[:31] + [(float(t), 300.0 * (t - t % 10 - 30)) for t in range(31, 61)]
    (row,), _ = EN.per_gpu([EN.Gpu("n", "u", "0", energy)], [EN.Rank("n", "0", counter(2.0), counter(4000.0))], {})
    assert row.resets == 1 and row.joules == pytest.approx(300.0 * 60)   # 9000 J before the reload, 9000 J after
    assert row.j_per_token == pytest.approx(300.0 * 60 / (4000.0 * 60))


@pytest.mark.parametrize("gpus, ranks, why", [
    ([], [EN.Rank("n", "0", counter(1.0), counter(10.0))], EN.NO_GPU),
    ([EN.Gpu("n", "u", "0", [], mig=True)], [EN.Rank("n", "0", counter(1.0), counter(10.0))], EN.MIG),
    ([EN.Gpu("n", "u", "0", [])], [EN.Rank("n", "0", counter(1.0), counter(10.0))], EN.NO_COUNTER),
    ([EN.Gpu("n", "u", "0", stale(300.0, period=40, t1=30))], [EN.Rank("n", "0", counter(1.0), counter(10.0))],
     EN.FEW_READS),
    ([EN.Gpu("n", "u", "0", stale(300.0))], [], EN.NO_STEPS),
])
def test_not_checked_says_why(gpus, ranks, why):
    _, job = EN.per_gpu(gpus, ranks, {})
    assert job.j_per_step is None and job.j_per_token is None and job.why_step == job.why_token == why


def test_steps_without_tokens_give_joules_per_step_only():
    (row,), job = EN.per_gpu([EN.Gpu("n", "u", "0", stale(300.0))], [EN.Rank("n", "3", counter(2.0))], {})
    assert row.j_per_step == pytest.approx(150.0) and row.j_per_token is None
    assert row.why_token.startswith("not checked: no tokens counted on rank 3") and job.why_token == row.why_token


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1e9, allow_nan=False), min_size=2, max_size=30))
def test_increase_is_never_negative_and_equals_the_growth_without_resets(values):
    total, resets = EN.increase(values)
    assert total >= 0 and 0 <= resets < len(values)
    if resets == 0:
        assert total == pytest.approx(values[-1] - values[0], abs=1e-6)


def test_a_gpu_counter_split_by_a_label_change_is_one_counter_again():
    """A GPU's series gets a new label set when a job starts owning it: the points join by (host, UUID)."""
    def get(**labels):
        return lambda key, default="": labels.get(key, default)
    gpu = {N.HOST: "n", N.HW_ID: "u0", N.GPU_INDEX: "0"}
    energy = stale(300.0)
    before, after = energy[:25], energy[25:]
    gpus, ranks, on_gpu = _build([(get(**gpu), [])], [(get(**gpu), before), (get(**gpu, **{N.JOB: "j"}), after)],
                                 [(get(**gpu, **{N.RANK: "0"}), [])], [(get(**{N.HOST: "n", N.RANK: "0"}), counter(2.0))],
                                 [(get(**{N.HOST: "n", N.RANK: "0"}), counter(4000.0))])
    assert [g.energy for g in gpus] == [energy] and on_gpu == {("n", "u0"): {"0"}}
    (row,), _ = EN.per_gpu(gpus, ranks, on_gpu)
    assert row.joules == pytest.approx(18000.0) and row.j_per_token == pytest.approx(0.075)
