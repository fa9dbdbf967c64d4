"""The report's time alignment (otel_gpu/report/align.py) on synthetic exports: an event that starts and
stops at known times, read as a cumulative counter or a windowed gauge at jittered export times, is drawn
where it happened (to within the export interval it fell in), with its whole amount, never later."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.report import align as A

T0 = 1.7e9


@st.composite
def exports_and_event(draw):
    """Export times (about 1 s apart, jittered) over a run, and an event [e0, e1) inside it."""
    n = draw(st.integers(8, 60))
    interval = draw(st.sampled_from([0.5, 1.0, 2.0]))
    jitter = draw(st.lists(st.floats(-0.2, 0.2), min_size=n, max_size=n))
    t = T0 + interval * (np.arange(1, n + 1) + np.asarray(jitter) * 0.5)
    e0 = draw(st.floats(float(t[1] - T0), float(t[-3] - T0))) + T0
    e1 = e0 + draw(st.floats(0.1, 8.0))
    e1 = min(e1, float(t[-2]))
    return t, interval, e0, e1


def truth_on(a, b, e0, e1):
    """Seconds of the event [e0, e1) inside (a, b]."""
    return np.maximum(0.0, np.minimum(b, e1) - np.maximum(a, e0))


def covering(t, x):
    """(start, end) of the export interval (t[k-1], t[k]] holding time x."""
    k = int(np.searchsorted(t, x, "left"))
    return t[k - 1], t[k]


@settings(max_examples=200, deadline=None)
@given(exports_and_event(), st.floats(0.2, 5.0))
def test_a_step_shaped_counter_increase_is_drawn_over_its_interval_not_after(case, rate):
    t, interval, e0, e1 = case
    cum = rate * truth_on(-np.inf, t, e0, e1)            # the counter as exported: cumulative at each export
    edges = A.cell_edges(t[0], t[-1], max_cells=4000, min_s=0.05)
    drawn = A.on_cells(A.counter_segments(t, cum), edges)
    width = np.diff(edges)
    mass = np.nansum(drawn * width)
    assert abs(mass - rate * (e1 - e0)) <= 1e-6 * max(1.0, mass)          # all of it, once
    lo, hi = covering(t, e0)[0], covering(t, e1)[1]
    outside = (edges[1:] <= lo) | (edges[:-1] >= hi)
    assert np.nansum(np.abs(drawn[outside])) == 0, "drawn outside the export intervals the event touched"
    inside = (edges[:-1] >= covering(t, e0)[1]) & (edges[1:] <= covering(t, e1)[0])
    assert np.allclose(drawn[inside], rate), "an export interval wholly inside the event reads the event's rate"
    centre = np.nansum(drawn * width * (edges[:-1] + edges[1:]) / 2) / mass
    assert abs(centre - (e0 + e1) / 2) <= 1.5 * interval                  # not shifted by an interval or more


@settings(max_examples=200, deadline=None)
@given(exports_and_event(), st.floats(0.1, 1.0))
def test_a_windowed_gauge_is_drawn_over_the_window_it_averages(case, level):
    t, interval, e0, e1 = case
    prev = np.concatenate([[t[0] - interval], t[:-1]])
    v = level * truth_on(prev, t, e0, e1) / (t - prev)  # each export: the mean over the window before it
    edges = A.cell_edges(t[0] - interval, t[-1], max_cells=4000, min_s=0.05)
    drawn = A.on_cells(A.gauge_segments(t, v), edges)
    width = np.diff(edges)
    assert abs(np.nansum(drawn * width) - level * (e1 - e0)) <= 1e-6 * max(1.0, level * (e1 - e0))
    lo, hi = covering(t, e0)[0], covering(t, e1)[1]
    outside = (edges[1:] <= lo) | (edges[:-1] >= hi)
    assert np.nansum(drawn[outside]) == 0
    inside = (edges[:-1] >= covering(t, e0)[1]) & (edges[1:] <= covering(t, e1)[0])
    assert np.allclose(drawn[inside], level)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 3.0), st.floats(0.0, 5.0)), min_size=1, max_size=40),
       st.floats(0.01, 1.0), st.floats(0.0, 0.5))
def test_each_cell_is_the_time_weighted_mean_of_the_segments_it_meets(segs, cell, gap):
    lengths, values = np.asarray(segs).T
    ends = T0 + np.cumsum(lengths + gap)
    starts = ends - lengths
    edges = A.cell_edges(starts[0] - 1, ends[-1] + 1, max_cells=100000, min_s=cell)
    drawn = A.on_cells((starts, ends, values), edges)
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):   # the definition, cell by cell
        w = truth_on(starts, ends, lo, hi)
        if w.sum() > 1e-4:   # (a cell that meets a segment by a few ulps of a unix time may go either way)
            assert abs(drawn[i] - (w * values).sum() / w.sum()) <= 1e-5 * max(1.0, values.max())
        elif w.sum() == 0:
            assert np.isnan(drawn[i])


@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=30))
def test_spill_back_keeps_the_total_and_fills_no_interval_past_its_room(inc):
    out = A.spill_back(np.asarray(inc), np.ones(len(inc)))
    assert abs(out.sum() - sum(inc)) <= 1e-9 * max(1.0, sum(inc))
    assert np.all(out[1:] <= 1 + 1e-12)
    assert np.all(out >= 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 3.0), min_size=1, max_size=60), st.lists(st.floats(0.05, 2.0), min_size=2, max_size=60))
def test_back_to_back_steps_are_drawn_over_the_time_they_ran(durations, gaps):
    ends = T0 + np.cumsum(durations)                      # steps back to back from T0
    t = T0 + np.cumsum(gaps)
    t = t[t >= ends[0]]                                   # exports from the first step's end on
    if not len(t):
        return
    n = np.searchsorted(ends, t, "right")                 # steps ended by each export
    sums = np.concatenate([[0.0], np.cumsum(durations)])[n]
    a, b, v = A.step_segments(t, sums, n.astype(float))
    new = np.diff(n, prepend=0) > 0
    assert len(b) == new.sum() and np.all(a <= b) and np.all(a[1:] >= b[:-1] - 1e-9)
    last = ends[n[new] - 1]                               # the true end of the last step counted at each
    first = np.concatenate([[T0], ends])[np.concatenate([[0], n])[:-1][new]]   # ... and start of the first
    slack = np.minimum.accumulate((t - ends[n - 1])[::-1])[::-1][new]   # least slack of this or a later export
    assert np.all(b >= last - 1e-6) and np.all(b <= t[new] + 1e-9)
    assert np.allclose(b - last, slack, atol=1e-6), "as late as the best later export allows, no later"
    assert np.all(a >= first - 1e-6) and np.allclose(a - first, slack, atol=1e-6)
    means = np.diff(np.concatenate([[0.0], sums[new]])) / np.diff(np.concatenate([[0], n[new]]))
    assert np.allclose(v, means)
    assert A.first_step_start(t, sums) == pytest.approx(T0 + slack.min(), abs=1e-6)


def test_a_drop_is_a_restart_counted_from_zero():
    assert list(A.increases([3.0, 5.0, 1.0, 4.0])) == [3.0, 2.0, 1.0, 3.0]
