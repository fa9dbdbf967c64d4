"""The watch's change-over-time check: a rank (or the job) slower than its own earlier windows."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from otel_gpu.diagnose.model import RankStats, Window
from otel_gpu.diagnose.slowdown import OwnBest
from otel_gpu.diagnose.thresholds import Thresholds

TH = Thresholds()


def window(end: float, busy: dict[str, float], wait: dict[str, float] | None = None, steps: int = 100,
           length: float = 60.0) -> Window:
    """`busy` s per step per rank; every rank's step is the slowest rank's busy time (synchronous)."""
    step = max(busy.values())
    ranks = [RankStats(rank=r, host="n1", steps=steps, step_time_s=step * steps, step_count=steps,
                       phases={"forward": b * steps}, collective_s=(step - b) * steps,
                       collective_by_phase={"": (step - b) * steps}) for r, b in busy.items()]
    return Window(job="j", start=end - length, end=end, ranks=ranks)


def test_the_rank_whose_busy_time_rose_is_named_once_it_has_lasted_a_third_of_the_window():
    ob = OwnBest()
    for t in range(0, 60, 10):
        assert ob.check(window(t + 60.0, {"0": 0.050, "1": 0.050}), TH) == []
    said = [(t, ob.check(window(t + 60.0, {"0": 0.050, "1": 0.070}), TH)) for t in range(60, 120, 10)]
    first = next(t for t, fs in said if fs)
    assert first >= 60 + 20, "not before a third of the 60 s window"
    (f,) = dict(said)[first]
    assert f.rule == "slowdown" and f.where["ranks"] == ["1"] and f.severity == "warning"
    assert f.evidence["since"] == 120.0 and abs(f.evidence["share"] - 0.4) < 1e-6


def test_every_rank_slower_is_one_finding_for_the_job():
    ob = OwnBest()
    for t in range(0, 60, 10):
        ob.check(window(t + 60.0, {"0": 0.050, "1": 0.050}), TH)
    found = [f for t in range(60, 120, 10) for f in ob.check(window(t + 60.0, {"0": 0.100, "1": 0.100}), TH)]
    assert found and {f.title.split(" ")[0] for f in found} == {"steps"} and found[-1].severity == "critical"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.92, 1.12), st.floats(0.92, 1.12)), min_size=5, max_size=40))   # at most 22% apart
def test_drift_below_the_threshold_is_never_said(noise):
    ob = OwnBest()
    for i, (a, b) in enumerate(noise):
        assert ob.check(window(60.0 + 10 * i, {"0": 0.05 * a, "1": 0.05 * b}), TH) == []


def test_windows_with_too_few_steps_are_not_judged():
    ob = OwnBest()
    for t in range(0, 200, 10):
        assert ob.check(window(t + 60.0, {"0": 0.05 if t < 100 else 0.5}, steps=2), TH) == []
