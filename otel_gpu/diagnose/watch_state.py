"""Which findings are open while a job is watched: appear, change severity, clear (pure).

Each evaluation hands `Tracker.update` the findings of the window that ends now. A finding is
known by its rule and its subject (`finding_key`). It *appears* once it has been seen in
`confirm` evaluations in a row spanning at least `confirm_s` seconds (ranks sharing CPUs drift
apart for seconds at a time: that is not a straggler); its severity goes *up* at once and *down* only after the lower
severity has held for `hold_s`; it *clears* only after it has not been seen for `hold_s` seconds.
So a condition that comes and goes inside the hold time is one open finding, not a line every
evaluation, and nothing is said twice.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .findings import SEVERITIES

EVENTS = ("appeared", "changed", "cleared")
DEFAULT_HOLD_S = 60.0    # a finding clears (or lowers its severity) after this long without it (seconds)
DEFAULT_CONFIRM = 2      # evaluations in a row before a finding appears
DEFAULT_CONFIRM_S = 15.0  # ... spanning at least this many seconds
RANK = {s: i for i, s in enumerate(reversed(SEVERITIES))}   # info 0 < warning 1 < critical 2
_NUMBERS = re.compile(r"[-+]?\d[\d,.]*%?")


PER_RANK = frozenset({"straggler", "stall", "slowdown"})   # one finding per rank named: the ranks are its subject
PER_TITLE = frozenset({"throttle", "memory"})             # several things at once: a reason, GPU memory or swap


def finding_key(f: Mapping[str, Any]) -> tuple:
    """What makes a finding the same one from one evaluation to the next: its rule; and the ranks it
    names for the per-rank rules, its title without numbers for the rules that report several things
    at once. Otherwise the rule alone: the ranks a share is seen on, or the cause a periodic drop is
    matched to, may move as the window slides without making it another finding."""
    rule = f["rule"]
    if rule in PER_RANK:
        return (rule, tuple(f.get("where", {}).get("ranks", ())))
    if rule in PER_TITLE:
        return (rule, _NUMBERS.sub("#", f["title"]))
    return (rule,)


@dataclass
class _Open:
    finding: dict            # the latest sighting
    severity: str            # the severity last announced
    appeared_t: float
    first_seen_t: float      # first evaluation that saw it (the condition began at or before this)
    last_seen_t: float
    lower: str | None = None          # a lower severity seen since `lower_since` (not announced yet)
    lower_since: float | None = None


@dataclass
class _Pending:
    finding: dict
    first_seen_t: float
    seen: int = 1


@dataclass
class Tracker:
    hold_s: float = DEFAULT_HOLD_S
    confirm: int = DEFAULT_CONFIRM
    confirm_s: float = DEFAULT_CONFIRM_S
    min_severity: str = "info"     # findings below this are not watched
    open: dict[tuple, _Open] = field(default_factory=dict)
    pending: dict[tuple, _Pending] = field(default_factory=dict)

    def __post_init__(self):
        if self.min_severity not in RANK:
            raise ValueError(f"severity {self.min_severity!r} not in {SEVERITIES}")
        if not (self.hold_s >= 0 and self.confirm_s >= 0) or self.confirm < 1:
            raise ValueError("hold_s and confirm_s must be >= 0, confirm >= 1")

    def update(self, t: float, findings: Iterable[Mapping[str, Any]]) -> list[dict]:
        """The events decided at `t` (unix s) from this evaluation's findings (`Finding.as_dict()`s);
        notes of rules that could not run (`missing`) are not findings and are ignored."""
        now: dict[tuple, dict] = {}
        for f in findings:
            if f.get("missing") or RANK[f["severity"]] < RANK[self.min_severity]:
                continue
            k = finding_key(f)
            if k not in now or RANK[f["severity"]] > RANK[now[k]["severity"]]:
                now[k] = dict(f)
        events: list[dict] = []
        for k, f in now.items():
            if k in self.open:
                events += self._seen_open(t, self.open[k], f)
                continue
            p = self.pending.get(k)
            if p is None:
                p = self.pending[k] = _Pending(f, t, 0)
            p.seen += 1
            p.finding = f
            if p.seen >= self.confirm and t - p.first_seen_t >= self.confirm_s:
                del self.pending[k]
                self.open[k] = _Open(f, f["severity"], t, p.first_seen_t, t)
                events.append(_event(t, "appeared", f, first_seen_t=p.first_seen_t))
        for k in [k for k in self.pending if k not in now]:   # a blip shorter than `confirm`: forgotten
            del self.pending[k]
        for k in [k for k in self.open if k not in now]:
            o = self.open[k]
            if t - o.last_seen_t >= self.hold_s:
                del self.open[k]
                events.append(_event(t, "cleared", {**o.finding, "severity": o.severity}, first_seen_t=o.first_seen_t,
                                     absent_s=t - o.last_seen_t))
        return events

    def _seen_open(self, t: float, o: _Open, f: dict) -> list[dict]:
        o.finding, o.last_seen_t = f, t
        sev = f["severity"]
        if RANK[sev] > RANK[o.severity]:   # worse: said at once
            old, o.severity, o.lower, o.lower_since = o.severity, sev, None, None
            return [_event(t, "changed", f, previous=old, first_seen_t=o.first_seen_t)]
        if RANK[sev] == RANK[o.severity]:
            o.lower = o.lower_since = None
            return []
        if o.lower is None:   # better: said only once it has held, as the worst seen meanwhile
            o.lower, o.lower_since = sev, t
        elif RANK[sev] > RANK[o.lower]:
            o.lower = sev
        if t - o.lower_since >= self.hold_s:
            old, o.severity, o.lower, o.lower_since = o.severity, o.lower, None, None
            return [_event(t, "changed", {**f, "severity": o.severity}, previous=old, first_seen_t=o.first_seen_t)]
        return []


def _event(t: float, kind: str, f: Mapping[str, Any], previous: str | None = None, **extra: float) -> dict:
    """One event: `t` and `event` first, then the finding's fields (as `diagnose --json` writes them)."""
    out: dict[str, Any] = {"t": round(t, 3), "event": kind}
    out.update({k: v for k, v in f.items() if k not in out})
    if previous is not None:
        out["previous_severity"] = previous
    out.update({k: round(v, 3) for k, v in extra.items()})
    return out
