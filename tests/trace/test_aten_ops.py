"""The deepest-wrapping-op search of the ATen-op table against a brute force, on random intervals."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.trace.aten_ops import deepest_wrapping


def brute(op_ts, op_end, start, end):
    """HTA's rule: of the ops with ts <= start and end >= end, the latest start; among equal
    starts the first in (row) order."""
    match = [i for i in range(len(op_ts)) if op_ts[i] <= start and op_end[i] >= end]
    if not match:
        return -1
    best = max(op_ts[i] for i in match)
    return min(i for i in match if op_ts[i] == best)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 40)), max_size=40),
       st.lists(st.tuples(st.integers(0, 70), st.integers(0, 10)), min_size=1, max_size=20))
def test_deepest_wrapping_matches_brute_force(ops, calls):
    ops = sorted(ops, key=lambda o: o[0])  # sorted by start; ties keep their (row) order
    op_ts = np.array([o[0] for o in ops], dtype=np.float64)
    op_end = np.array([o[0] + o[1] for o in ops], dtype=np.float64)
    starts = np.array([c[0] for c in calls], dtype=np.float64)
    ends = starts + np.array([c[1] for c in calls], dtype=np.float64)
    got = deepest_wrapping(op_ts, op_end, starts, ends).tolist()
    assert got == [brute(op_ts, op_end, s, e) for s, e in zip(starts, ends)]
