"""The report's stacked "Phase shares" plot, from a recording of known content (two ranks: data wait 10%,
forward 50%, 20% blocked in collectives outside any phase): the plot data holds each phase's own share,
collective wait is a band of its own (not "unphased"), and in headless Chromium the hover (the legend at
the cursor) shows each band's own share, not the running sum the plot draws."""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from otel_gpu import names as N
from otel_gpu.record.decode import Point
from otel_gpu.record.store import Writer
from otel_gpu.report import data as rd
from otel_gpu.report.build import write_report

from .conftest import chromium
from .test_report_time_alignment import plot_of, report_data

OWN = {"data_wait": 0.1, "forward": 0.5}      # seconds per second of wall time, each rank
WAIT = 0.2                                     # blocked in collectives outside any phase (host clock)
SECONDS = 30

# after the page has drawn: move the mouse over the middle of the phases plot and copy its legend out
HOVER = """<script>
setTimeout(() => {
  const over = document.querySelector("#plot-phases .u-over"), r = over.getBoundingClientRect();
  const at = { clientX: r.left + r.width / 2, clientY: r.top + r.height / 2, bubbles: true };
  over.dispatchEvent(new MouseEvent("mouseenter", at));
  over.dispatchEvent(new MouseEvent("mousemove", at));
  setTimeout(() => {
    const rows = [...document.querySelectorAll("#plot-phases .u-legend .u-series")].map(
      (tr) => tr.querySelector(".u-label").textContent + "=" + tr.querySelector(".u-value").textContent);
    const out = document.createElement("pre");
    out.id = "hover";
    out.textContent = rows.join("\\n");
    document.body.append(out);
  }, 300);
}, 500);
</script></body>"""


def write_recording(directory: Path, t0: float) -> None:
    job, host = "stack", "node-a"
    res = (("host.name", host), ("otelgpu.job", job))
    w = Writer(directory, {"job": job, "host": host, "started": repr(t0), "ended": repr(t0 + SECONDS + 0.5),
                           "exit_status": "0", "command": '["python", "train.py"]'})
    for i in range(1, SECONDS + 1):
        t, pts = t0 + i, []
        for r in (0, 1):
            a = res + (("otelgpu.rank", str(r)), ("otelgpu.world_size", "2"))
            n = 10 * i
            pts += [Point(N.TRAIN_STEPS.name, "counter", "{step}", "cumulative", res, a, t, n),
                    Point(N.TRAIN_STEP_DURATION.name, "histogram", "s", "cumulative", res, a, t, 0.1 * n, n, (0, n), (1.0,)),
                    Point(N.TRAIN_COLLECTIVE_TIME.name, "counter", "s", "cumulative", res,
                          a + ((N.COLLECTIVE, "all_reduce"), (N.COLLECTIVE_BASIS, "host"), (N.PHASE, "")), t, WAIT * i)]
            pts += [Point(N.TRAIN_PHASE_TIME.name, "counter", "s", "cumulative", res, a + ((N.PHASE, p),), t, v * i)
                    for p, v in OWN.items()]
        w.add_points(pts)
    w.close()


@pytest.fixture(scope="module")
def stacked(tmp_path_factory):
    d = tmp_path_factory.mktemp("stack")
    write_recording(d / "run", time.time() - 600)
    write_report([d / "run"], d / "report.html")
    return d


def test_the_plot_data_holds_each_bands_own_share_and_collective_wait_apart(stacked):
    p = plot_of(report_data(stacked / "report.html"), "phases")
    assert p["stacked"] and [s["label"] for s in p["series"]] == ["data_wait", "forward", rd.COLLECTIVE_WAIT, rd.UNPHASED]
    want = {**OWN, rd.COLLECTIVE_WAIT: WAIT, rd.UNPHASED: 1 - sum(OWN.values()) - WAIT}
    for s in p["series"]:
        inner = [v for v in s["values"][2:-2] if v is not None]   # away from the edges of the recording
        assert inner and all(v == pytest.approx(want[s["label"]], abs=0.01) for v in inner), (s["label"], inner)


def test_hover_shows_each_bands_own_share(stacked):
    page = stacked / "hover.html"
    page.write_text((stacked / "report.html").read_text().replace("</body>", HOVER, 1))
    proc = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--virtual-time-budget=10000", "--dump-dom", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    hover = re.search(r'<pre id="hover">(.*?)</pre>', proc.stdout, re.S)
    assert hover, "the hover script did not run: " + proc.stderr[-2000:]
    shown = dict(line.split("=", 1) for line in hover.group(1).strip().splitlines())
    assert shown == {"time": shown["time"], "data_wait": "10.0%", "forward": "50.0%", "collective wait": "20.0%",
                     "unphased": "20.0%"}, shown
    assert shown["time"].endswith("s)"), shown
