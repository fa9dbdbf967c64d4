"""pandas ``describe()`` of a numeric array (count, mean, std, min, quartiles, max), HTA's interval
statistics; quantiles computed as numpy's linear ``np.quantile`` computes them, bit for bit, without
its generic machinery (about 60 us a call on arrays of a few dozen values, over 1 ms for a scalar
quantile; called per stream and category, and per kernel type, on every rank)."""
from __future__ import annotations

import numpy as np

STAT_COLUMNS = ("count", "mean", "std", "min", "25%", "50%", "75%", "max")
_QUARTILES = np.array([0.25, 0.5, 0.75])


def quartiles(x: np.ndarray) -> np.ndarray:
    """``np.quantile(x, [0.25, 0.5, 0.75])`` (method "linear"), the same floats; ``x`` 1-D, not empty."""
    return quantiles(x, _QUARTILES)


def quantiles(x: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """``np.quantile(x, qs)`` (method "linear"), the same floats, for ``qs`` a 1-D float64 array of
    values in [0, 1]; ``x`` 1-D, not empty."""
    s = np.sort(x)
    if s.dtype.kind not in "iuf" or (s.dtype.kind == "f" and np.isnan(s[-1])):
        return np.quantile(x, qs)   # NaN (sorted last) or another dtype: numpy's own rules
    n = len(s)
    at = (n - 1) * qs   # positions in the sorted values, as numpy's linear method computes them
    below = np.floor(at)
    i = below.astype(np.intp)
    j = np.minimum(i + 1, n - 1)
    t = at - below
    if n == 1:   # numpy takes the last value for both neighbours, weighted as position - (-1)
        t = at + 1
    a, b = s[i], s[j]
    diff = b - a
    out = a + diff * t   # numpy's lerp: from the nearer neighbour (same rounding)
    np.subtract(b, diff * (1 - t), out=out, where=t >= 0.5, casting="unsafe")
    return out


def describe(x: np.ndarray) -> dict:
    """pandas ``describe()`` of a numeric array: count, mean, std (n-1), min, quartiles, max."""
    if len(x) == 0:
        return {"count": 0.0, **{c: float("nan") for c in STAT_COLUMNS[1:]}}
    q = quartiles(x)
    return {"count": float(len(x)), "mean": float(x.mean()), "std": float(x.std(ddof=1)) if len(x) > 1 else
            float("nan"), "min": float(x.min()), "25%": float(q[0]), "50%": float(q[1]), "75%": float(q[2]),
            "max": float(x.max())}
