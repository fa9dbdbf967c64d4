"""The median of a few numbers as ``numpy.median`` gives it, in plain Python: numpy's median imports
``numpy.ma`` (1.2 MB of resident memory) in a process that has no other use for it (the one that
combines the ranks' results)."""
from __future__ import annotations

import math
from typing import Iterable


def median(values: Iterable[float]) -> float:
    """``float(numpy.median(values))``: the middle value, or the mean of the two middle values
    (``(a + b) / 2``, as numpy's mean of two); NaN where any value is NaN or there is none."""
    xs = sorted(float(x) for x in values)
    if not xs or any(math.isnan(x) for x in xs):
        return math.nan
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
