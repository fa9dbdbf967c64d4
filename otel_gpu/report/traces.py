"""The report's "Profiler traces" section: the run's captures (`otel-gpu run --trace-steps`, `otel-gpu trace
capture`) as `otel_gpu.trace.run_traces` summarised them: links to each capture's rank files and analysis,
its findings, each rank's profiled step time against its unprofiled one, and the captures not made.
Links are relative to the run folder (where the report of a run is written)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence
from urllib.parse import quote

from ..safe_text import html_text


def section(dirs: Sequence[Path]) -> dict | None:
    """The trace summary of the first run folder that has one (None: no capture in this run)."""
    from ..trace.run_traces import load_summary
    for d in dirs:
        summary = load_summary(Path(d))
        if summary is not None:
            return summary
    return None


def gpu_time(dirs: Sequence[Path], summary: dict | None) -> dict:
    """Per rank, the GPU time by launching code of the run's captures (frames -> ns; {} when none had
    GPU activity), from the run folder that holds `summary`."""
    from ..trace.run_traces import load_gpu_time, load_summary
    for d in dirs:
        if summary is not None and load_summary(Path(d)) == summary:
            return load_gpu_time(Path(d), summary)
    return {}


def _link(path: str, text: str) -> str:
    return f'<a href="{html_text(quote("traces/" + path))}">{html_text(text)}</a>'


def _ms(v) -> str:
    return f"{1000 * v:.1f} ms" if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def _ratio(captured, unprofiled) -> str:
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (captured, unprofiled))
    return f"{captured / unprofiled:.2f}x" if ok and unprofiled > 0 else "not checked"


def _capture(c: dict) -> str:
    start, end = c["steps"]
    parts = [f"<h3>Steps {int(start)}-{int(end)}</h3>"]
    if c.get("error"):
        return "".join(parts) + f"<p>Not analysed: {html_text(str(c['error']))}</p>"
    files = ", ".join(_link(str(p), f"rank {r}") for r, p in sorted(c["files"].items(), key=lambda kv: kv[0]))
    more = [_link(c[k], label) for k, label in (("analysis", "analysis (JSON)"), ("findings_text", "findings (text)"))
            if c.get(k)]
    parts.append(f"<p>Traces: {files}" + (f"; {', '.join(more)}" if more else "") + "</p>")
    rows = "".join(f"<tr><td>{html_text(str(r))}</td><td>{_ms(v[0])}</td><td>{_ms(v[1])}</td>"
                   f"<td>{_ratio(v[0], v[1])}</td></tr>" for r, v in sorted(c["step_times"].items()))
    parts.append("<table class=\"trace-steps\"><tr><th>rank</th><th>profiled step (median of the trace's steps)</th>"
                 "<th>unprofiled step (median outside every capture)</th><th>profiled / unprofiled</th></tr>"
                 f"{rows}</table>")
    if c["findings"]:
        items = "".join(f"<li><b>{html_text(f['title'])}</b>, ranks {html_text(str(f['ranks_text']))}: "
                        f"{float(f['share_pct']):.1f}% of the {html_text(str(f['span']))} at stake. "
                        f"Fix: {html_text(str(f['fix']))}</li>" for f in c["findings"])
        parts.append(f"<ol class=\"trace-findings\">{items}</ol>")
    else:
        parts.append("<p>No anti-pattern found in the trace.</p>")
    return "".join(parts)


def html(summary: dict | None) -> str:
    """The section's HTML ("" without captures); a damaged summary is one line in the section."""
    if summary is None:
        return ""
    try:
        body = "".join(_capture(c) for c in summary["captures"])
        body += "".join(f"<p class=\"trace-missing\">Not captured: {html_text(str(n))}</p>"
                        for n in summary.get("not_captured") or [])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        body = f"<p>The trace summary could not be read ({html_text(type(exc).__name__)}).</p>"
    return f'<section id="sec-traces"><h2>Profiler traces</h2>{body or "<p>No capture.</p>"}</section>'
