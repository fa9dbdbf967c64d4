"""The interval statistics' quartiles are numpy's linear np.quantile, bit for bit, on any array."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from otel_gpu.trace.describe import describe, quantiles, quartiles

Q = [0.25, 0.5, 0.75]
floats = hnp.arrays(np.float64, st.integers(1, 60),
                    elements=st.floats(allow_nan=True, allow_infinity=True, width=64))
ints = hnp.arrays(np.int64, st.integers(1, 60), elements=st.integers(-(1 << 40), 1 << 40))
nice = hnp.arrays(np.float64, st.integers(1, 60), elements=st.floats(-1e6, 1e6, allow_subnormal=False))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a.view(np.uint64), b.view(np.uint64))


@settings(max_examples=400, deadline=None)
@given(st.one_of(floats, ints, nice))
def test_quartiles_are_numpys_linear_quantile_bit_for_bit(x):
    with np.errstate(invalid="ignore"):   # inf - inf between neighbours: NaN, in both
        ours, numpys = quartiles(x), np.quantile(x, Q)
    assert same_bits(ours, numpys), (x, ours, numpys)


def test_describe_gives_what_pandas_describe_gives():
    # pandas.Series([1, 2, 3, 4]).describe() and pandas.Series([7.5]).describe()
    assert describe(np.array([1.0, 2.0, 3.0, 4.0])) == {
        "count": 4.0, "mean": 2.5, "std": 1.2909944487358056, "min": 1.0, "25%": 1.75, "50%": 2.5, "75%": 3.25,
        "max": 4.0}
    one = describe(np.array([7.5]))
    assert np.isnan(one.pop("std")) and one == {"count": 1.0, "mean": 7.5, "min": 7.5, "25%": 7.5, "50%": 7.5,
                                                "75%": 7.5, "max": 7.5}


@given(nice)
def test_describe_quartiles_lie_between_min_and_max(x):
    d = describe(x)
    assert d["count"] == len(x) and d["min"] <= d["25%"] <= d["50%"] <= d["75%"] <= d["max"]


def test_describe_of_nothing_is_count_zero_and_nan():
    d = describe(np.array([], dtype=np.float64))
    assert d["count"] == 0.0 and all(np.isnan(d[k]) for k in ("mean", "std", "min", "25%", "50%", "75%", "max"))


@settings(max_examples=400, deadline=None)
@given(st.one_of(floats, ints, nice), st.lists(st.floats(0, 1), min_size=1, max_size=5))
def test_quantiles_are_numpys_linear_quantile_bit_for_bit(x, qs):
    """Any quantile, not only quarters (the top-kernel table folds its tail at np.quantile(sums, 0.8))."""
    qs = np.array(qs, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        ours, numpys = quantiles(x, qs), np.quantile(x, qs)
    assert same_bits(ours, numpys), (x, qs, ours, numpys)
