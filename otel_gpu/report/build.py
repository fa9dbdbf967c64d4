"""Building a report from one or more run directories (the nodes of one job): diagnosis, plots,
flame graphs, summary; written atomically as one HTML file."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from .. import output
from ..diagnose import run_rules
from ..diagnose.findings import Finding
from ..diagnose.thresholds import Thresholds
from ..diagnose.model import DiagnoseError
from ..record.diagnose import nonfinite_note
from ..record.reader import Recording, RecordingError
from ..record.session import relative
from ..record.store import DB_NAME
from ..safe_text import visible
from ..words import count
from ..record.window import recorded_window
from . import data as rd
from . import work as rwork
from . import health as rhealth
from . import energy as renergy
from ..energy_read import from_recording as energy_of
from .flames import add_gpu_time, flames
from .traces import gpu_time as trace_gpu_time, section as trace_section
from .steps import fmt_median, step_summary
from .html import render

REPORT_NAME = "report.html"


@dataclass
class Built:
    html: str
    findings: list[Finding]
    summary: list[dict]
    job: str | None
    seconds: float
    notes: list[str] = field(default_factory=list)
    energy: list[str] = field(default_factory=list)   # the run summary's energy lines
    work: list[str] = field(default_factory=list)     # the run summary's work lines (TFLOP/s, MFU, time)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def build(rec: Recording, thresholds: Thresholds | None = None) -> Built:
    t0 = time.perf_counter()
    span = rec.span()
    if span is None:
        raise RecordingError(f"{', '.join(map(str, rec.dirs))}: the recording is empty")
    start, end = span
    findings, note, window = [], "", None
    try:
        window = recorded_window(rec)
        findings = run_rules(window, thresholds)
    except DiagnoseError as exc:
        note = f"No diagnosis: {exc}"
    summary = step_summary(rec)
    hosts = len({s["host"] for s in summary})
    meta = rec.metas[0]
    status = meta.get("exit_status")
    when = datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    notes = [n for n in (nonfinite_note(rec),) if n]
    subtitle = (f"{when}, {end - start:.0f} s, {_count(len(summary), 'rank')} on {_count(len(rec.dirs), 'node')}"
                + (f", exit status {status}" if status is not None else ", still running or cut off")
                + f"; command: {' '.join(json.loads(meta.get('command', '[]')))}" + "".join(f"; {n}" for n in notes))
    data = {
        "job": rec.job, "start": start, "end": end, "subtitle": subtitle,
        "summary": [{"label": rd.rank_label(s["host"], s["rank"], hosts), "steps": s["steps"],
                     "median": fmt_median(s)} for s in summary],
        "findings": [f.as_dict() for f in findings], "diagnosis_note": note,
        "plots": rd.plots(rec, start, end), "flames": flames(rec),
        "traces": trace_section(rec.dirs),   # the run's profiler captures, analysed at its end
        "work": rwork.section(window),   # TFLOP/s, MFU and where the time went
        "health": rhealth.section(window),   # GC per step, CUDA allocator, per rank
    }
    gpu = trace_gpu_time(rec.dirs, data["traces"])   # GPU time by launching code, beside the CPU flame graph
    if gpu:
        add_gpu_time(data["flames"], gpu)
    rows, job = energy_of(rec)
    data["energy"] = renergy.table(rows, job)
    built = Built(render(data), findings, summary, rec.job, time.perf_counter() - t0, notes,
                 renergy.summary_lines(rows, job))
    built.work = rwork.summary_lines(data["work"])
    return built


def input_files(dirs: Sequence[Path]) -> list[Path]:
    """The files a report reads: its output may replace none of them."""
    return [Path(d) / DB_NAME for d in dirs]


def write_report(dirs: Sequence[Path], out: Path, thresholds: Thresholds | None = None,
                 inputs: Sequence[Path | str] = ()) -> Built:
    """Build the report of `dirs` and write it to `out` (never over one of `inputs` nor a recording)."""
    inputs = [*inputs, *input_files(dirs)]
    output.check(out, inputs)
    with Recording.open(dirs) as rec:
        built = build(rec, thresholds)
    output.write(out, built.html, inputs)   # a new report gets the umask's mode; an existing one keeps its own
    return built


def summary_text(built: Built, out: Path) -> str:
    """The lines printed at the end of a recorded run: steps, median step time per rank, top findings
    (names from the recording shown `visible`)."""
    hosts = len({s["host"] for s in built.summary})
    lines = [f"otel-gpu: job {visible(built.job or '-')}"] + [f"  note: {n}" for n in built.notes]
    for s in built.summary:
        lines.append(f"  {visible(rd.rank_label(s['host'], s['rank'], hosts))}: {count(round(s['steps']), 'step')}, "
                     f"median step {fmt_median(s)}")
    if not built.summary:
        lines.append("  no training steps recorded")
    top = [f for f in built.findings if not f.missing][:3]
    for i, f in enumerate(top, 1):
        lines.append(f"  {i}. [{f.severity}] {visible(f.title)}")
    lines += built.energy
    lines += built.work
    if built.summary and not top:
        lines.append("  no bottleneck found")
    lines.append(f"otel-gpu: report {visible(str(relative(out)))}")
    return "\n".join(lines)


def write_report_for_run(directory: Path) -> str:
    """The report of a recorded run, in its directory; returns the summary to print."""
    out = directory / REPORT_NAME
    return summary_text(write_report([directory], out), out)
