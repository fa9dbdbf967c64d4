"""A trial's score: its steady-state step time (seconds, warm-up steps excluded).

From Prometheus: the step-duration histogram's `_sum` and `_count` labelled with the trial id,
read raw (one instant query of a range selector) so the first sample at or past the warm-up
marks the start of the steady window; per rank, mean = delta sum / delta count; the trial's
step time is its slowest rank's. Completeness: every rank reported, and enough steady steps.
Without Prometheus: the same from the training log (`trainer_log.jsonl` of the Hugging Face /
LLaMA-Factory callbacks, or tqdm `s/it` progress lines).
Evidence for the report (GPU activity, interconnect, GPU memory, host, collective time per step)
comes from the node agent's and the ranks' metrics over the trial's steady window (`evidence.py`).
"""
from __future__ import annotations

import json
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from .. import names
from ..words import count
from . import evidence as E
from .evidence import COLLECTIVES, COLUMNS, NOT_CHECKED
from .trial import LOG_NAME, TRIAL_LABEL

STEP_METRIC = names.TRAIN_STEP_DURATION.prometheus_name()     # otelgpu_train_step_duration_seconds
QUIET_S = 5.0    # no new sample this long after a trial ended: its last export is in (VictoriaMetrics: 2-3 s)
RANK_LABEL, WORLD_LABEL = names.RANK.replace(".", "_"), names.WORLD_SIZE.replace(".", "_")


from .evidence import MEMORY_KEY  # noqa: E402,F401  (re-exported)


@dataclass(frozen=True)
class StepStats:
    step_time_s: float | None        # steady-state mean step time of the slowest rank
    steady_steps: int                # steps in the steady window (fewest over ranks)
    total_steps: int                 # steps seen (most over ranks)
    ranks: int = 1                   # ranks that reported
    expected_ranks: int | None = None
    window: tuple[float, float] | None = None    # unix seconds of the steady window
    source: str = "prometheus"
    per_rank: dict = field(default_factory=dict, compare=False)
    last_seen: float | None = None   # unix seconds of the newest sample of the slowest-reporting rank

    def problem(self, min_steps: int) -> str | None:
        """Why this is not a complete measurement (None: complete)."""
        if self.total_steps == 0:
            return f"no step metrics seen ({self.source})"
        if self.expected_ranks and self.ranks < self.expected_ranks:
            return f"only {self.ranks} of {count(self.expected_ranks, 'rank')} reported steps"
        if self.step_time_s is None or self.steady_steps < min_steps:
            return f"{count(self.steady_steps, 'step')} after warm-up, {min_steps} needed ({self.total_steps} seen)"
        return None


NONE = StepStats(None, 0, 0, 0)


# ---- pure: from histogram samples ---------------------------------------------------------------

def steady_from_histogram(series: Iterable, warmup: int) -> StepStats:
    """Series of `<metric>_sum` and `<metric>_count` (raw samples) -> StepStats."""
    groups: dict[tuple, dict[str, dict[float, float]]] = {}
    labels_of: dict[tuple, dict] = {}
    for s in series:
        kind = "count" if s.labels.get("__name__", "").endswith("_count") else "sum"
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "__name__"))
        groups.setdefault(key, {"count": {}, "sum": {}})[kind].update(dict(s.points))
        labels_of[key] = s.labels
    per_rank, expected = {}, None
    for key, g in groups.items():
        times = sorted(set(g["count"]) & set(g["sum"]))
        if not times:
            continue
        labels = labels_of[key]
        rank = labels.get(RANK_LABEL, str(len(per_rank)))
        if labels.get(WORLD_LABEL, "").isdigit():
            expected = max(expected or 0, int(labels[WORLD_LABEL]))
        times = [t for t in times if math.isfinite(g["count"][t]) and math.isfinite(g["sum"][t])
                 and g["count"][t] >= 0 and g["sum"][t] >= 0]   # NaN or negative: not a sample to count
        if not times:
            continue
        counts, sums = [g["count"][t] for t in times], [g["sum"][t] for t in times]
        start = next((i for i, c in enumerate(counts) if c >= warmup), None)
        entry = {"total": int(counts[-1]), "steady": 0, "mean": None, "window": None, "last": times[-1]}
        if start is not None and counts[-1] > counts[start]:
            n = counts[-1] - counts[start]
            mean = (sums[-1] - sums[start]) / n
            entry.update(steady=int(n), window=(times[start], times[-1]),
                         mean=mean if math.isfinite(mean) and mean > 0 else None)   # a reset counter: no mean
        per_rank[(labels.get("host_name", ""), rank)] = entry
    if not per_rank:
        return NONE
    means = [e["mean"] for e in per_rank.values()]
    complete = all(m is not None for m in means)
    windows = [e["window"] for e in per_rank.values() if e["window"]]
    window = (max(w[0] for w in windows), min(w[1] for w in windows)) if windows else None
    return StepStats(max(means) if complete else None,
                     min(e["steady"] for e in per_rank.values()),
                     max(e["total"] for e in per_rank.values()),
                     len(per_rank), expected, window, "prometheus",
                     {f"{h}/{r}" if h else r: e["mean"] for (h, r), e in per_rank.items()},
                     min(e["last"] for e in per_rank.values()))


# ---- pure: from logs ---------------------------------------------------------------------------

def _hms(text: str) -> float | None:
    """'1:02:03', '02:03', '1 day, 0:00:01' -> seconds."""
    m = re.fullmatch(r"\s*(?:(\d+) days?, )?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)\s*", str(text))
    if not m:
        return None
    d, h, mi, s = m.groups()
    return int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi) * 60 + float(s)


def _from_points(points: list[tuple[int, float]], warmup: int, source: str) -> StepStats:
    """(step, elapsed seconds) in order -> mean over the steps after warm-up."""
    if not points:
        return StepStats(None, 0, 0, 0, source=source)
    total = points[-1][0]
    start = next((p for p in points if p[0] >= warmup), None)
    if start is None or total <= start[0] or points[-1][1] <= start[1]:
        return StepStats(None, 0, total, 1, source=source)
    n = total - start[0]
    return StepStats((points[-1][1] - start[1]) / n, n, total, 1, window=None, source=source)


def parse_trainer_log(text: str, warmup: int) -> StepStats:
    """`trainer_log.jsonl` lines ({"current_steps": N, "elapsed_time": "H:MM:SS", ...})."""
    points = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        step, raw = row.get("current_steps"), row.get("elapsed_time")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            continue                    # a row that is not a step: never a number made up from it
        if isinstance(raw, str):
            elapsed = _hms(raw)
        elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
            elapsed = float(raw)
        else:
            continue
        if elapsed is not None and math.isfinite(elapsed) and elapsed >= 0 and (not points or step > points[-1][0]):
            points.append((step, elapsed))
    return _from_points(points, warmup, "trainer_log.jsonl")


_TQDM = re.compile(r"(\d+)/(\d+) \[([\d:]+)<[^,\]]*,\s*(\d+(?:\.\d*)?|\.\d+)(s/it|it/s)")


def parse_progress(text: str, warmup: int, min_span_s: float = 20.0) -> StepStats:
    """tqdm progress lines ('  7/40 [00:03<00:14,  2.31it/s]'). tqdm's elapsed time has whole
    seconds: over spans shorter than `min_span_s` the median of its rates after warm-up is used."""
    points, rates = [], []
    for m in _TQDM.finditer(text.replace("\r", "\n")):
        clock = m.group(3)
        step, elapsed = int(m.group(1)), _hms(clock if clock.count(":") else "0:" + clock)
        if elapsed is None or (points and step <= points[-1][0]):
            continue
        points.append((step, elapsed))
        value = float(m.group(4))
        if step > warmup and 0 < value < math.inf:
            rates.append(value if m.group(5) == "s/it" else 1.0 / value)
    if not points:
        return StepStats(None, 0, 0, 0, source="progress bar")
    total = points[-1][0]
    start = next((p for p in points if p[0] >= warmup), None)
    if start is None or total <= start[0]:
        return StepStats(None, 0, total, 1, source="progress bar")
    n, span = total - start[0], points[-1][1] - start[1]
    if span >= min_span_s:
        return StepStats(span / n, n, total, 1, source="progress bar")
    return StepStats(statistics.median(rates) if rates else None, n, total, 1, source="progress bar")


# ---- objectives ---------------------------------------------------------------------------------

class LogObjective:
    """Scores from the trial folder: any `trainer_log.jsonl` under it, else the command's output."""

    name = "log"

    def __init__(self, warmup: int):
        self.warmup = warmup

    def measure(self, trial_id: str, directory: Path, start: float, end: float | None = None) -> StepStats:
        logs = sorted(directory.rglob("trainer_log.jsonl"))
        if logs:
            return parse_trainer_log(logs[-1].read_text(errors="replace"), self.warmup)
        path = directory / LOG_NAME
        text = path.read_text(errors="replace") if path.exists() else ""
        return parse_progress(text, self.warmup)

    def final(self, trial_id: str, directory: Path, start: float, end: float, min_steps: int) -> StepStats:
        return self.measure(trial_id, directory, start, end)

    def evidence(self, stats: StepStats, trial_id: str = "", directory: Path | None = None) -> dict:
        """Nothing was exported: the reasons only."""
        why = "not checked: scored from the training log (--no-instrument without --prometheus): nothing recorded"
        return {NOT_CHECKED: {k: why for k in (*(c[0] for c in COLUMNS), COLLECTIVES)}}


class PromObjective:
    """Scores from PromQL. `selector` (e.g. 'host_name=~"gpu-.*"') narrows the evidence queries."""

    name = "prometheus"

    def __init__(self, client, warmup: int, selector: str = "", settle_s: float = 15.0, fresh_s: float = 5.0,
                 sleep: Callable[[float], None] = time.sleep, trial_agent: bool = False, quiet_s: float = QUIET_S):
        self.client, self.warmup, self.settle_s, self.fresh_s, self._sleep = client, warmup, settle_s, fresh_s, sleep
        self.quiet_s = max(fresh_s, quiet_s)
        self.trial_agent = trial_agent
        self.selector = "{" + selector.strip().strip("{}") + "}" if selector.strip() else ""

    def query_for(self, trial_id: str, seconds: float) -> str:
        window = max(1, math.ceil(seconds) + 60)
        return (f'{{__name__=~"{STEP_METRIC}_(sum|count)",{TRIAL_LABEL}="{_escape(trial_id)}"}}[{window}s]')

    def measure(self, trial_id: str, directory: Path, start: float, end: float | None = None) -> StepStats:
        end = time.time() if end is None else end
        return steady_from_histogram(self.client.query(self.query_for(trial_id, end - start)), self.warmup)

    def final(self, trial_id: str, directory: Path, start: float, end: float, min_steps: int) -> StepStats:
        """The score after the trial ended: re-read until it is complete and either every rank's
        newest sample is within `fresh_s` of the end (the ranks export once more as they exit) or
        nothing new arrived for `quiet_s` (a launcher such as torchrun outlives its ranks' last
        export by seconds), or `settle_s` passed (backends make fresh samples queryable after a delay)."""
        deadline = time.monotonic() + self.settle_s
        seen, since = None, time.monotonic()
        while True:
            stats = self.measure(trial_id, directory, start, time.time())
            now = time.monotonic()
            if (stats.total_steps, stats.last_seen) != seen:
                seen, since = (stats.total_steps, stats.last_seen), now
            fresh = stats.last_seen is not None and stats.last_seen >= end - self.fresh_s
            if (stats.problem(min_steps) is None and (fresh or now - since >= self.quiet_s)) or now >= deadline:
                return stats
            self._sleep(0.5)

    def evidence(self, stats: StepStats, trial_id: str = "", directory: Path | None = None) -> dict:
        """Node-agent readings and collective time per step over the steady window (`evidence.py`);
        with `trial_agent` (the tuner ran the trial's own node agent) only that agent's readings."""
        if not stats.window:
            return {}
        node = self.selector.strip("{}")
        trial = f'{TRIAL_LABEL}="{_escape(trial_id)}"'
        if self.trial_agent and trial_id:
            node = ",".join(filter(None, [node, trial]))
        return E.from_prometheus(lambda q, at: self.client.query(q, time=at), node, trial, *stats.window)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
