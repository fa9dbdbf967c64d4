"""Quantiles from explicit-bucket histograms: the estimate lies in the bucket that holds the true
order statistic, whatever the observations."""
from __future__ import annotations

import bisect
import math

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.histogram import merge, quantile
from otel_gpu.names import STEP_BUCKETS


def counts_of(values, bounds) -> list[float]:
    counts = [0.0] * (len(bounds) + 1)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1   # (b_{i-1}, b_i]: OTLP's bucket rule
    return counts


values = st.lists(st.floats(min_value=0.0, max_value=900.0, allow_nan=False), min_size=1, max_size=300)


@settings(max_examples=300, deadline=None)
@given(values, st.floats(min_value=0.0, max_value=1.0))
def test_the_estimate_is_in_the_bucket_of_the_true_order_statistic(vs, q):
    bounds = list(STEP_BUCKETS)
    got = quantile(q, bounds, counts_of(vs, bounds))
    k = max(1, math.ceil(q * len(vs)))           # the rank histogram_quantile interpolates towards
    true = sorted(vs)[k - 1]
    assert got.lo <= got.value <= got.hi
    assert got.count == len(vs)
    assert got.lo - 1e-9 <= true <= got.hi + 1e-9 or (q == 0 and true <= got.hi)
    if math.isinf(got.hi):
        assert true > bounds[-1] and got.value == bounds[-1]


@settings(max_examples=100, deadline=None)
@given(values, values)
def test_merging_is_counting_both(a, b):
    bounds = list(STEP_BUCKETS)
    merged = merge([(bounds, counts_of(a, bounds)), (bounds, counts_of(b, bounds))])
    assert merged == (tuple(bounds), counts_of(a + b, bounds))


def test_empty_and_bad_input():
    assert quantile(0.5, [1.0], [0, 0]) is None
    assert merge([]) is None
    with pytest.raises(ValueError, match="outside"):
        quantile(1.5, [1.0], [1, 0])
    with pytest.raises(ValueError, match="bucket counts"):
        quantile(0.5, [1.0, 2.0], [1, 0])
    with pytest.raises(ValueError, match="different bucket bounds"):
        merge([([1.0], [1, 0]), ([2.0], [1, 0])])


def test_step_buckets_resolve_a_median_to_13_percent():
    b = STEP_BUCKETS
    assert list(b) == sorted(set(b)) and b[0] == 0.001 and b[-1] == 600.0
    ratios = [hi / lo for lo, hi in zip(b, b[1:]) if 0.01 <= lo < 100]
    assert max(ratios) <= 1.28
