"""'During X vs otherwise' compares with training time, never the start-up before the first step:
the checkpoint and input rules' comparisons, and the activity signal the periodic rule reads."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.diagnose import timeseries as ts
from otel_gpu.diagnose.model import RankStats, Timeline
from otel_gpu.diagnose.rules_train import checkpoint, input_bound
from otel_gpu.diagnose.thresholds import Thresholds

from .windows import T0, grid, window

TH = Thresholds()
STARTUP = 20.0   # seconds of imports and model loading before the first step


def _rank(r: int, **phases: float) -> RankStats:
    """Steps from T0 + STARTUP to T0 + 120 (first export 1 s after the first step, which took 0.5 s)."""
    return RankStats(rank=str(r), host="n0", steps=100, step_time_s=99.0, step_count=100, phases=dict(phases),
                     samples=100, first_t=T0 + STARTUP + 1.0, last_t=T0 + 120.0, first_step_s=0.5, started=True)


def _window(phase: str, util_in: float, util_out: float, util_startup: float, every: int = 10):
    t = grid(120.0, 1.0)
    inside = [STARTUP + 5 <= x - T0 and int(x - T0) % every < 3 for x in t]   # the phase 3 s of every `every`
    util = [util_startup if x - T0 < STARTUP else util_in if m else util_out for x, m in zip(t, inside)]
    occ = [2.0 if m else 0.0 for m in inside]
    w = window(ranks=[_rank(0, **{phase: 24.0}), _rank(1, **{phase: 24.0})],
               timeline=Timeline(t=t, series={"util": util, f"phase_{phase}": occ}), step=1.0)
    w.interval_s = 1.0
    w.set_training_span()
    return w, inside


def test_training_span_starts_at_the_first_step():
    w, _ = _window("data_wait", 0.4, 0.07, 0.0)
    assert w.train_start == pytest.approx(T0 + STARTUP + 1.0 - 0.5 - 0.5 * 0.99)
    assert w.train_end == T0 + 120.0 and w.training_s() == pytest.approx(100.0 - 0.005 + 0.5 * 0.99 - 0.495, abs=1)
    mask = ts.training_mask(w)
    assert not any(m for x, m in zip(w.timeline.t, mask) if x < w.train_start + 3.0)   # one smoothing range after
    assert all(m for x, m in zip(w.timeline.t, mask) if x >= w.train_start + 3.0)


def test_input_otherwise_is_training_time_outside_the_wait_not_start_up():
    # start-up at 0% utilization would pull "otherwise" down from 7% towards 5%
    w, _ = _window("data_wait", util_in=0.406, util_out=0.074, util_startup=0.0)
    [f] = input_bound(w, TH)
    assert "GPU utilization 40.6% while ranks wait for data vs 7.4% otherwise" in f.seen


def test_checkpoint_activity_during_saves_vs_the_rest_of_training():
    w, _ = _window("checkpoint", util_in=0.063, util_out=0.373, util_startup=0.02)
    [f] = checkpoint(w, TH)
    assert "GPU utilization 6.3% during saves vs 37.3% otherwise" in f.seen
    assert f.evidence["activity_outside"] == pytest.approx(0.373)


def test_periodic_activity_leaves_start_up_out():
    w, _ = _window("data_wait", 0.4, 0.07, 0.0)
    what, values = ts.activity(w)
    assert what == "GPU utilization"
    assert all(v is None for x, v in zip(w.timeline.t, values) if x - T0 < STARTUP)
    assert ts.activity(w, training_only=False)[1][0] == 0.0


def test_no_ranks_means_the_whole_window():
    w = window(timeline=Timeline(t=grid(), series={"util": [0.5] * len(grid())}))
    w.set_training_span()
    assert w.train_start is None and ts.training_mask(w) == [True] * len(grid())


@settings(max_examples=100, deadline=None)
@given(first=st.floats(0.0, 100.0), length=st.floats(0.0, 100.0), interval=st.floats(0.1, 10.0))
def test_training_mask_lies_inside_the_span(first, length, interval):
    w = window(timeline=Timeline(t=grid(120.0, 1.0)), step=1.0, duration=120.0)
    w.interval_s = interval
    w.train_start, w.train_end = T0 + first, T0 + min(120.0, first + length)
    for x, m in zip(w.timeline.t, ts.training_mask(w)):
        if m:
            assert w.train_start <= x <= w.train_end
