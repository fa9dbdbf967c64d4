"""The end of `otel-gpu run`: every capture of the run analysed as `otel-gpu trace analyze` would, and
what the report and the closing lines show of it.

For each capture folder (traces/steps-S-E/) the analyses and findings of `trace analyze` run over its
rank files, the last captured step included (a capture stops after the device finished step E, so
that step is whole: HTA's rule of dropping it is for traces cut at an arbitrary point). The full
result goes to traces/analysis/steps-S-E.json, the findings as text to steps-S-E.txt, the GPU time by
launching code per rank (where the trace has GPU activity) to steps-S-E.gpu_time.json, and a summary
of every capture to traces/summary.json, which the report reads. Each rank's captured step time (the
median of its `ProfilerStep#N` spans in the trace) is set against its unprofiled step time (the median
of its steps outside every capture, by the rank's own step timer, the step after a capture excluded:
it pays the capture's stop and write). A capture a rank could not make (the job ended before step S,
the rank was past it, the profiler failed) is one line, with the rank's own reason.
"""
from __future__ import annotations

import io
import json
import math
import statistics
from pathlib import Path

from .. import words
from ..safe_text import visible
from . import capture_files as cf

SUMMARY = "summary.json"
ANALYSIS = "analysis"
SUMMARY_MAX = 4 << 20     # bytes of a summary the report reads
GPU_TIME_SUFFIX = ".gpu_time.json"   # per capture: GPU time by launching code, per rank
GPU_TIME_MAX = 16 << 20   # bytes of one capture's GPU-time file the report reads
MESSAGE_MAX = 300         # characters of a rank's message shown


def step_times(doc: dict, statuses: list[dict]) -> dict[int, tuple[float | None, float | None]]:
    """Per rank of an analysis document: (captured step s: the median of its ProfilerStep spans in the
    trace; unprofiled step s: its latest status's median step outside every capture), None where not
    known (pure)."""
    spans: dict[int, list[float]] = {}
    for row in doc.get("cross_rank", {}).get("steps", []):
        for rank, cell in row.get("per_rank", {}).items():
            spans.setdefault(int(rank), []).append(cell["step_us"] / 1e6)
    unprofiled = unprofiled_step_s(statuses)
    out = {}
    for rank in doc.get("ranks", []):
        captured = statistics.median(spans[rank]) if spans.get(rank) else None
        out[rank] = (captured, unprofiled.get(rank))
    return out


def unprofiled_step_s(statuses: list[dict]) -> dict[int, float]:
    """Rank -> its median step time outside every capture (s), from its latest status; ranks without one
    left out (pure)."""
    latest: dict[str, dict] = {}
    for s in statuses:
        if s["rank"] not in latest or s["time"] >= latest[s["rank"]]["time"]:
            latest[s["rank"]] = s
    out = {}
    for rank, s in latest.items():
        u = s.get("unprofiled_median_s")
        if rank.isdigit() and isinstance(u, (int, float)) and not isinstance(u, bool) and math.isfinite(u) and u > 0:
            out[int(rank)] = float(u)
    return out


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{1000 * s:.1f} ms"


def step_times_text(times: dict[int, tuple[float | None, float | None]]) -> str:
    """'profiled steps 12.1 ms vs 10.3 ms unprofiled (rank 0); ...' (pure)."""
    return "; ".join(f"profiled steps {_ms(c)} vs {_ms(u)} unprofiled (rank {r})" for r, (c, u) in sorted(times.items()))


def _rank_list(ranks: list[str]) -> str:
    from .grouping import rank_ranges
    if ranks and all(r.isdigit() for r in ranks):
        return f"{words.noun(len(ranks), 'rank')} {rank_ranges([int(r) for r in ranks])}"
    return f"{words.noun(len(ranks), 'rank')} {', '.join(visible(r) for r in ranks)}"


def not_captured(statuses: list[dict], wanted: tuple[int, int] | None) -> list[str]:
    """One line per reason a capture was not made, with the ranks it holds for (pure): a rank that ended
    before the window, was past it, or failed, and a rank whose last status is still armed or capturing
    (it died before saying more); `wanted` (the run's --trace-steps) with no rank reporting at all."""
    by_reason: dict[str, list[str]] = {}
    for s in statuses:
        state, window = s["state"], s.get("window")
        if state in (cf.ENDED, cf.MISSED, cf.FAILED):
            reason = visible(str(s.get("message") or state)[:MESSAGE_MAX])
        elif state in (cf.ARMED, cf.CAPTURING, cf.WRITING) and isinstance(window, list) and len(window) == 2:
            reason = (f"steps {window[0]}-{window[1]} not captured: the rank stopped reporting at step {s['step']} "
                      f"({state})")
        else:
            continue
        by_reason.setdefault(reason, []).append(s["rank"])
    lines = [f"{_rank_list(ranks)}: {reason}" for reason, ranks in by_reason.items()]
    if wanted and not statuses:
        lines.append(f"steps {wanted[0]}-{wanted[1]} not captured: no rank started training "
                     "(a rank registers at its first step or data batch)")
    return lines


def _finding_rows(doc: dict) -> list[dict]:
    return [{"pattern": f["pattern"], "title": f["title"], "ranks_text": f["ranks_text"],
             "share_pct": f["share_of_span_pct"]["median"], "span": f["span"],
             "time_at_stake_us": f["time_at_stake_us"], "fix": f["fix"]} for f in doc.get("findings", [])]


def _findings_text(doc: dict) -> str:
    from rich.console import Console

    from .report import render_findings
    buf = io.StringIO()
    render_findings(doc, Console(file=buf, width=100, color_system=None, soft_wrap=False))
    return buf.getvalue()


def analyse_capture(root: Path, start: int, end: int, folder: Path, statuses: list[dict]) -> dict:
    """One capture folder analysed (its results written under root/analysis/); a summary dict. A
    failure is its "error" (one line), never an exception."""
    from .analyze import Options, analyze, jsonable
    from .model import load_set
    from .parse import TraceFormatError

    name = folder.name
    entry: dict = {"steps": [start, end], "folder": name, "files": {}, "ranks": [], "findings": [],
                   "notes": [], "step_times": {}, "analysis": None, "findings_text": None, "gpu_time": None,
                   "error": None}
    try:
        ts = load_set(str(folder), include_last_step=True)
        unprofiled = {r: 1e6 * s for r, s in unprofiled_step_s(statuses).items()}   # the launch-bound check's basis
        doc = analyze(ts, Options(unprofiled_step_us=unprofiled), jobs=1)
        gpu = gpu_time_doc(ts)   # GPU time by launching code, for the report's flame graph
    except TraceFormatError as exc:
        entry["error"] = visible(str(exc))
        return entry
    except Exception as exc:  # a trace the analyses cannot take: said, the run's end goes on
        entry["error"] = f"the analysis failed: {visible(repr(exc))[:MESSAGE_MAX]}"
        return entry
    entry["ranks"] = doc["ranks"]
    entry["files"] = {str(r): str(Path(p).relative_to(root)) if Path(p).is_relative_to(root) else p
                      for r, p in doc["files"].items()}
    entry["findings"] = _finding_rows(doc)
    entry["notes"] = [visible(n) for n in doc["notes"][:8]]
    entry["step_times"] = {str(r): list(v) for r, v in step_times(doc, statuses).items()}
    out = root / ANALYSIS
    try:
        out.mkdir(exist_ok=True)
        cf.write_whole(out / f"{name}.json", json.dumps(jsonable(doc), indent=1, allow_nan=False))
        cf.write_whole(out / f"{name}.txt", _findings_text(doc))
        entry["analysis"], entry["findings_text"] = f"{ANALYSIS}/{name}.json", f"{ANALYSIS}/{name}.txt"
        if gpu:
            cf.write_whole(out / f"{name}{GPU_TIME_SUFFIX}", json.dumps(gpu, allow_nan=False))
            entry["gpu_time"] = f"{ANALYSIS}/{name}{GPU_TIME_SUFFIX}"
    except OSError as exc:
        entry["error"] = f"the analysis was not written: {exc.strerror or exc}"
    return entry


def gpu_time_doc(ts) -> dict[str, list]:
    """Per rank, its GPU time by launching code as JSON rows [[frame, ...], ns] (ranks with no GPU
    activity left out: a CPU-only capture gives {})."""
    from .gpu_flame import set_stacks

    return {str(rank): [[list(frames), ns] for frames, ns in stacks.items() if ns > 0]
            for rank, stacks in set_stacks(ts).items() if any(ns > 0 for ns in stacks.values())}


def load_gpu_time(run_dir: Path, summary: dict | None) -> dict[int, dict[tuple[str, ...], int]]:
    """Per rank, the GPU time by launching code of every capture of a run (summed over captures; frames
    root first -> ns), from the files `finish_run` wrote; a file missing, too large or malformed is left
    out."""
    out: dict[int, dict[tuple[str, ...], int]] = {}
    for c in (summary or {}).get("captures", []):
        rel = c.get("gpu_time") if isinstance(c, dict) else None
        if not isinstance(rel, str) or ".." in Path(rel).parts:
            continue
        raw = cf.read_small(Path(run_dir) / cf.RUN_SUBDIR / rel, GPU_TIME_MAX)
        try:
            doc = json.loads(raw) if raw is not None else {}
        except ValueError:
            continue
        for rank, rows in (doc.items() if isinstance(doc, dict) else ()):
            if not (isinstance(rank, str) and rank.lstrip("-").isdigit() and isinstance(rows, list)):
                continue
            mine = out.setdefault(int(rank), {})
            for row in rows:
                if (isinstance(row, list) and len(row) == 2 and isinstance(row[0], list)
                        and all(isinstance(f, str) for f in row[0]) and isinstance(row[1], int) and row[1] > 0):
                    key = tuple(visible(f) for f in row[0])
                    mine[key] = mine.get(key, 0) + row[1]
    return {r: s for r, s in out.items() if s}


def finish_run(root: Path, wanted: tuple[int, int] | None) -> tuple[dict | None, list[str]]:
    """Every capture in trace folder `root` analysed, root/summary.json written: (the summary, the lines
    to print). (None, []) when the run asked for no capture and none was made."""
    root = Path(root)
    statuses = cf.read_statuses(root)
    folders = cf.captures(root)
    if not folders and wanted is None and not any(s["state"] != cf.IDLE for s in statuses):
        return None, []
    summary = {"trace_dir": str(root), "wanted": list(wanted) if wanted else None,
               "captures": [analyse_capture(root, a, b, f, statuses) for a, b, f in folders],
               "not_captured": not_captured(statuses, wanted)}
    lines = []
    for c in summary["captures"]:
        where = root / c["folder"]
        if c["error"]:
            lines.append(f"trace of steps {c['steps'][0]}-{c['steps'][1]} ({where}): not analysed: {c['error']}")
            continue
        head = (f"trace of steps {c['steps'][0]}-{c['steps'][1]}, {_rank_list([str(r) for r in c['ranks']])} "
                f"({where}): " + step_times_text({int(r): tuple(v) for r, v in c["step_times"].items()}))
        lines.append(head)
        for i, f in enumerate(c["findings"][:3], 1):
            lines.append(f"  {i}. {f['title']} (ranks {f['ranks_text']}, {f['share_pct']:.1f}% of the {f['span']})")
        if not c["findings"]:
            lines.append("  no anti-pattern found in the trace")
    lines += [f"trace not captured: {n}" for n in summary["not_captured"]]
    try:
        cf.write_whole(root / SUMMARY, json.dumps(summary, indent=1, allow_nan=False))
    except (OSError, ValueError) as exc:
        lines.append(f"the trace summary was not written in {root}: {getattr(exc, 'strerror', None) or exc}")
    return summary, lines


def load_summary(run_dir: Path) -> dict | None:
    """A recorded run's trace summary (traces/summary.json), None when there is none or it does not parse."""
    raw = cf.read_small(Path(run_dir) / cf.RUN_SUBDIR / SUMMARY, SUMMARY_MAX)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("captures"), list) else None
