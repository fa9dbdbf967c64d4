"""The drain check's positions in step, made in one pass, are where_in_step's one time at a time."""
import numpy as np
from hypothesis import given, settings, strategies as st

from otel_gpu.trace.antipatterns import _positions_in_step
from otel_gpu.trace.idle_causes import where_in_step
from otel_gpu.trace.steps import step_of


@st.composite
def windows_and_times(draw):
    n = draw(st.integers(0, 5))
    starts = sorted(draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n)))
    wins = [(draw(st.integers(0, 3)) if draw(st.booleans()) else 10 + i, float(a), float(a + draw(st.integers(0, 300))))
            for i, a in enumerate(starts)]
    times = draw(st.lists(st.floats(-10, 1400, allow_nan=False), max_size=30))
    return wins, np.array(times, dtype=np.float64)


@settings(max_examples=200, deadline=None)
@given(windows_and_times())
def test_positions_match_one_at_a_time(case):
    wins, times = case
    want = [p for p in (where_in_step(t, wins)[1] for t in times.tolist()) if p is not None]
    assert _positions_in_step(times, wins) == want
    steps = {int(step_of(np.array([t]), wins)[0]) for t in times.tolist()} - {-1}
    assert set(step_of(times, wins).tolist()) - {-1} == steps


def test_positions_example():
    wins = [(10, 0.0, 100.0), (11, 100.0, 300.0)]
    assert _positions_in_step(np.array([50.0, 150.0, 400.0]), wins) == [50.0, 25.0]
