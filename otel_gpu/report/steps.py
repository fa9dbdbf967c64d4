"""The run's step summary for the report and `otel-gpu run`'s closing lines."""
from __future__ import annotations

from statistics import median

from .. import names as N
from ..record.reader import Recording
from .data import _by


def step_summary(rec: Recording) -> list[dict]:
    """Per rank: steps, and the median of the per-export mean step times (s)."""
    out = []
    hist = _by(rec.series(N.TRAIN_STEP_DURATION.name), N.HOST, N.RANK)
    for (host, rank), ss in _by(rec.series(N.TRAIN_STEPS.name), N.HOST, N.RANK).items():
        means = []
        for s in hist.get((host, rank), []):
            for i in range(1, min(len(s.points), len(s.counts))):
                dc = s.counts[i] - s.counts[i - 1]
                if dc > 0:
                    means.append((s.points[i][1] - s.points[i - 1][1]) / dc)
            if not means and s.counts and s.counts[-1] > 0:
                means.append(s.points[-1][1] / s.counts[-1])
        out.append({"host": host, "rank": rank, "steps": sum(s.points[-1][1] for s in ss),
                    "median_step_s": median(means) if means else None})
    return out


