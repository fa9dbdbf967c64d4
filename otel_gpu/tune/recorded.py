"""Scoring trials from their own recordings: `otel-gpu tune` on one machine, without Prometheus.

Each trial gets a loopback recorder (otel_gpu.record) in `<trial>/recording/`: its ranks export
there as under `otel-gpu run`. Steady-state step time and pruning read the recording while the trial
runs (SQLite allows readers beside the writer); at the end the trial's report is written next to it
(`recording/report.html`) and linked from the tuning report. A trial shorter than a few export
intervals is scored from its training log instead, as without instrumentation.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from .. import names
from ..record.reader import Recording, RecordingError
from ..safe_text import visible
from ..record.session import RecordedRun
from . import evidence as E
from .objective import NONE, LogObjective, StepStats, steady_from_histogram

log = logging.getLogger("otel_gpu.tune")
RECORDING = "recording"


@dataclass
class _PromLike:
    """A recorded histogram series in the shape `steady_from_histogram` reads (Prometheus labels)."""
    labels: dict[str, str]
    points: list[tuple[float, float]] = field(default_factory=list)


def histogram_series(rec: Recording) -> list[_PromLike]:
    """The step-duration histogram's `_sum` and `_count` series, labelled as Prometheus would."""
    base = names.TRAIN_STEP_DURATION.prometheus_name()
    out = []
    for s in rec.series(names.TRAIN_STEP_DURATION.name):
        labels = {k.replace(".", "_"): v for k, v in s.attrs.items()}
        out.append(_PromLike({**labels, "__name__": base + "_sum"}, list(s.points)))
        out.append(_PromLike({**labels, "__name__": base + "_count"}, [(t, c) for (t, _), c in zip(s.points, s.counts)]))
    return out


class RecordingObjective:
    """The objective interface of `PromObjective`, over each trial's own recording."""

    name = "recording"

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.runs: dict[str, RecordedRun] = {}
        self._where: dict[tuple[float, float], Path] = {}   # steady window -> the recording it was measured in

    def prepare(self, trial_id: str, directory: Path, env: Mapping[str, str]) -> dict[str, str]:
        """Start the trial's recorder; the trial's environment pointed at it."""
        run = RecordedRun(directory / RECORDING, trial_id, [trial_id], {})
        self.runs[trial_id] = run
        return run.child_env(env)

    def close(self, trial_id: str, exit_status: int = 0) -> None:
        """Stop the trial's recorder and write its report (a report failure is logged, not raised)."""
        run = self.runs.pop(trial_id, None)
        if run is None:
            return
        run.finish(exit_status)
        from ..report.build import REPORT_NAME, write_report
        try:
            write_report([run.directory], run.directory / REPORT_NAME)
        except (RecordingError, OSError, ValueError) as exc:
            log.warning("otel-gpu tune: no report for trial %s: %s", trial_id, visible(str(exc)))

    def measure(self, trial_id: str, directory: Path, start: float, end: float | None = None) -> StepStats:
        path = directory / RECORDING
        try:
            with Recording.open([path]) as rec:
                stats = steady_from_histogram(histogram_series(rec), self.warmup)
        except RecordingError:
            return NONE
        if stats.window:
            self._where[stats.window] = path
        return StepStats(stats.step_time_s, stats.steady_steps, stats.total_steps, stats.ranks, stats.expected_ranks,
                         stats.window, "recording", stats.per_rank, stats.last_seen)

    def final(self, trial_id: str, directory: Path, start: float, end: float, min_steps: int) -> StepStats:
        """The recording's score (closed at the trial's end: all is in); for a trial too short for its
        export interval to give a steady window, the training log's score when that one is complete."""
        stats = self.measure(trial_id, directory, start, end)
        if stats.problem(min_steps) is None:
            return stats
        logged = LogObjective(self.warmup).final(trial_id, directory, start, end, min_steps)
        return logged if logged.problem(min_steps) is None else stats

    def evidence(self, stats: StepStats, trial_id: str = "", directory: Path | None = None) -> dict:
        """Node-agent readings and collective time per step over the steady window (`evidence.py`)."""
        path = self._where.get(stats.window) if stats.window else None
        if path is None:
            return {}
        with Recording.open([path]) as rec:
            return E.from_recording(rec, *stats.window, agent_note=E.agent_note(path))
