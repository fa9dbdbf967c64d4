"""The run's step summary for the report and `otel-gpu run`'s closing lines: per rank, the steps and
the median step time, estimated from the step-time histogram's buckets (every step counted, not a
mean of means) with the bucket it falls in, so the figure says how fine it is."""
from __future__ import annotations

from collections import defaultdict

from .. import names as N
from ..histogram import merge, quantile
from ..record.reader import Recording
from .data import _by


def step_summary(rec: Recording) -> list[dict]:
    """Per rank: steps, the median step time (s, interpolated in its bucket) and that bucket's bounds (s)."""
    by_rank: dict[tuple[str, str], list] = defaultdict(list)
    for s, bounds, counts in rec.histograms(N.TRAIN_STEP_DURATION.name):
        by_rank[(s.get(N.HOST), s.get(N.RANK))].append((bounds, counts))
    out = []
    for (host, rank), ss in _by(rec.series(N.TRAIN_STEPS.name), N.HOST, N.RANK).items():
        row = {"host": host, "rank": rank, "steps": sum(s.points[-1][1] for s in ss),
               "median_step_s": None, "median_bucket_s": None}
        try:
            merged = merge(by_rank.get((host, rank), []))
        except ValueError:    # bounds changed within a rank (two otel-gpu versions): no honest median
            merged = None
        m = quantile(0.5, *merged) if merged else None
        if m is not None:
            row["median_step_s"], row["median_bucket_s"] = m.value, (m.lo, m.hi)
        out.append(row)
    return out


def fmt_s(v: float | None) -> str:
    """Seconds for a person: ms under 1 s; '-' for no value."""
    if v is None:
        return "-"
    return f"{1000 * v:.1f} ms" if v < 1 else f"{v:.2f} s"


def fmt_median(row: dict) -> str:
    """'68.4 ms (bucket 63-80 ms)': the median with the histogram bucket it was interpolated in."""
    v, bucket = row.get("median_step_s"), row.get("median_bucket_s")
    if v is None:
        return "-"
    if bucket is None:
        return fmt_s(v)
    lo, hi = bucket
    if hi == float("inf"):
        return f"over {fmt_s(lo)} (beyond the last bucket)"
    unit_ms = hi < 1
    span = (f"{1000 * lo:.3g}-{1000 * hi:.3g} ms" if unit_ms else f"{lo:.3g}-{hi:.3g} s")
    return f"{fmt_s(v)} (bucket {span})"
