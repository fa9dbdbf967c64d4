"""Quantiles of an explicit-bucket histogram (OTLP's `bucket_counts` over `explicit_bounds`).

The estimate is Prometheus' `histogram_quantile`: linear inside the bucket that holds the rank,
the first bucket starting at 0 (durations are not negative). It comes with that bucket's bounds,
so a figure can say how fine it is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Quantile:
    """`value` estimated inside the bucket [`lo`, `hi`] (same unit as the bounds); `hi` is inf when
    the rank falls in the overflow bucket, and `value` is then `lo` (a lower bound only)."""
    q: float
    value: float
    lo: float
    hi: float
    count: float

    @property
    def exact_bucket(self) -> bool:
        return math.isfinite(self.hi)


def merge(histograms: Iterable[tuple[Sequence[float], Sequence[float]]]) -> tuple[tuple[float, ...], list[float]] | None:
    """Sum the bucket counts of histograms with the same bounds; None when there are none.
    ValueError when bounds differ (summing them would misplace counts)."""
    bounds: tuple[float, ...] | None = None
    total: list[float] = []
    for b, counts in histograms:
        b = tuple(float(x) for x in b)
        if len(counts) != len(b) + 1:
            raise ValueError(f"{len(counts)} bucket counts for {len(b)} bounds (expected {len(b) + 1})")
        if bounds is None:
            bounds, total = b, [0.0] * len(counts)
        elif b != bounds:
            raise ValueError("histograms with different bucket bounds")
        total = [t + float(c) for t, c in zip(total, counts)]
    return None if bounds is None else (bounds, total)


def quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> Quantile | None:
    """The q-quantile (0 <= q <= 1) of the observations counted in `counts` (one per bucket:
    (-inf, b0], (b0, b1], ..., (b_last, +inf)); None when nothing was counted."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} bucket counts for {len(bounds)} bounds (expected {len(bounds) + 1})")
    n = float(sum(counts))
    if n <= 0:
        return None
    rank = q * n
    seen = 0.0
    for i, c in enumerate(counts):
        if c <= 0:
            continue
        if seen + c >= rank:
            lo = 0.0 if i == 0 else float(bounds[i - 1])
            if i == len(bounds):
                return Quantile(q, lo, lo, math.inf, n)
            hi = float(bounds[i])
            lo = min(lo, hi)
            return Quantile(q, lo + (hi - lo) * max(0.0, rank - seen) / c, lo, hi, n)
        seen += c
    raise AssertionError("unreachable: the counts sum to n")
