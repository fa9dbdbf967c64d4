"""The report as one self-contained HTML file: vendored uPlot and d3-flame-graph, our page script
and the report data inlined (opens offline, no server, no CDN)."""
from __future__ import annotations

from pathlib import Path

from ..safe_text import html_text, script_json
from .energy import html as energy_html
from .health import html as health_html
from .traces import html as traces_html
from .work import html as work_html

HERE = Path(__file__).resolve().parent
VENDOR = HERE / "vendor"
SCRIPTS = ("uPlot.iife.min.js", "d3-selection.min.js", "d3-flamegraph.min.js")
STYLES = ("uPlot.min.css", "d3-flamegraph.css")


def render(data: dict) -> str:
    title = f"otel-gpu report: {data.get('job') or 'run'}"
    css = "\n".join((VENDOR / s).read_text() for s in STYLES) + "\n" + (HERE / "page.css").read_text()
    libs = "\n".join(f"<script>{(VENDOR / s).read_text()}</script>" for s in SCRIPTS)
    ranks = "".join(f"<tr><td>{html_text(r['label'])}</td><td>{r['steps']:.0f}</td><td>{html_text(r['median'])}</td></tr>"
                    for r in data["summary"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html_text(title)}</title>
<style>{css}</style></head>
<body>
<h1>{html_text(title)}</h1>
<div class="meta">{html_text(data['subtitle'])}</div>
<div id="errors"></div>
<section id="sec-summary"><h2>Steps</h2>
<table id="summary"><tr><th>rank</th><th>steps</th><th>median step time</th></tr>{ranks}</table></section>
{energy_html(data.get("energy") or [])}
{work_html(data.get("work") or {})}
{health_html(data.get("health") or [])}
<section id="sec-findings"><h2>Findings</h2>
<div id="findings"></div></section>
{traces_html(data.get("traces"))}
<section id="sec-plots"><h2>Time series</h2>
<div id="plots"></div></section>
<h2 id="flames">Flame graphs (wall clock)</h2>
<div id="flame-controls">
<label>rank <select id="flame-rank"></select></label>
<label>phase <select id="flame-phase"></select></label>
<label>search <input id="flame-search" type="search" placeholder="function name"></label>
<button id="flame-reset" type="button">reset zoom</button>
<label><input id="flame-own" type="checkbox"> show otel-gpu's own threads</label>
<span id="flame-total"></span>
</div>
<p id="flame-note">The training processes' threads, sampled in Python. Native (C++/CUDA) frames are not sampled:
time in a thread that runs no Python code shows as one block named after the thread, e.g.
"pt_autograd_0 (native: backward kernels)", or "(native code, thread unnamed)" when its name is not known.</p>
<div id="flame"></div>
<script type="application/json" id="report-data">{script_json(data)}</script>
{libs}
<script>{(HERE / 'page.js').read_text()}</script>
</body></html>
"""
