"""`otel-gpu diagnose RUN_DIR...`: the diagnosis rules over a recording instead of Prometheus."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from ..diagnose import Report, run_rules
from ..diagnose.thresholds import Thresholds
from ..words import count
from .reader import Recording
from .window import recorded_window


def diagnose_recording(dirs: Sequence[str | Path], *, thresholds: Thresholds | None = None,
                       require_steps: bool = True) -> Report:
    """Read the recording (the nodes of one job), build the window, run every rule."""
    t0 = time.perf_counter()
    with Recording.open(dirs) as rec:
        w = recorded_window(rec, require_steps=require_steps)
        note = nonfinite_note(rec)
    if note:
        w.notes.append(note)
    findings = run_rules(w, thresholds)
    return Report(w, findings, {"source": "recording", "dirs": [str(d) for d in dirs]}, time.perf_counter() - t0)


def nonfinite_note(rec: Recording) -> str | None:
    """"3 recorded points were NaN or infinite: left out" when there were any (the reader skips them)."""
    n = rec.nonfinite_points()
    return f"{count(n, 'recorded point')} {'was' if n == 1 else 'were'} NaN or infinite: left out" if n else None
