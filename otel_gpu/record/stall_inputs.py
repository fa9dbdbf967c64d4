"""What the stall rule reads of each rank, from a recording: the part of `diagnose.queries.rank_summary`
tagged `steplast`, `open_*`, `seqs_*`/`seqc_*`, `recent_*`, plus the absolute step counter and step
time (a window that starts after the run did rebases the other counters; these stay absolute)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from .. import names as N
from ..diagnose.model import RECENT_S
from .reader import Recording

OUTSIDE = ("checkpoint", "eval")   # phases whose time between steps is not a stall
LOOKBACK_S = 300.0                 # an instant vector's lookback (`x offset 60s` finds a point this old)


def _key(s) -> tuple[str, str]:
    return (s.get(N.HOST), s.get(N.RANK))


def _increase(points: list[tuple[float, float]], since: float) -> float:
    """delta(): the last value minus the last value at or before `since` (0 when it started after)."""
    before = [v for t, v in points if t <= since]
    return max(0.0, points[-1][1] - (before[-1] if before else 0.0))


def stall_inputs_of(rec: Recording, start: float, end: float) -> dict[tuple[str, str], dict[str, Any]]:
    """(host, rank) -> RankStats fields for the stall rule over [start, end]."""
    out: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for s, st in rec.summaries(N.TRAIN_STEPS.name, start, end):
        got = out[_key(s)]
        got["steps_total"] = got.get("steps_total", 0.0) + st.last
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s, st in rec.summaries(N.TRAIN_STEP_DURATION.name, start, end):
        sums[_key(s)][0] += st.last
        sums[_key(s)][1] += st.last_count or 0.0
    for key, (total, count) in sums.items():
        out[key]["life_step_s"] = total / count if count else None
    for s, st in rec.summaries(N.TRAIN_STEP_LAST.name, start, end):
        got = out[_key(s)]
        got["step_last_t"] = max(st.last, got.get("step_last_t") or 0.0)
    for s, st in rec.summaries(N.TRAIN_COLLECTIVE_OPEN.name, start, end):
        kinds = out[_key(s)].setdefault("collective_open", {})
        kinds[s.get(N.COLLECTIVE)] = max(st.last, kinds.get(s.get(N.COLLECTIVE), 0.0))
    for s, st in rec.summaries(N.TRAIN_COLLECTIVE_SEQ.name, start, end):
        groups = out[_key(s)].setdefault("collective_seq", {})
        states = groups.setdefault(s.get(N.PROCESS_GROUP), {})
        state = s.get(N.COLLECTIVE_STATE)
        states[state] = max(st.last, states.get(state, st.last))
    since = end - min(RECENT_S, end - start)
    for spec in (N.TRAIN_PHASE_TIME, N.TRAIN_COLLECTIVE_TIME):
        for s in rec.series(spec.name, since - LOOKBACK_S, end):
            if s.get(N.PHASE) in OUTSIDE and s.points[-1][0] > since:
                got = out[_key(s)]
                got["recent_outside_s"] = (got.get("recent_outside_s") or 0.0) + _increase(s.points, since)
    return dict(out)
