"""The report of a real recorded run, opened in Debian's headless Chromium: no page errors, every
plot drawn with data (the GPU panels from the node agent's fake GPUs: tensor, DRAM, occupancy, memory,
power, clocks), the findings, a flame graph whose total is the recorded samples of the chosen
rank and phase, and a different one for another phase."""
from __future__ import annotations

import re
import sqlite3
import subprocess
from html.parser import HTMLParser

import pytest

from otel_gpu.record.diagnose import diagnose_recording

from .conftest import chromium

pytestmark = pytest.mark.slow
PLOTS_WITH_DATA = ("gpu", "gpu_tensor", "gpu_dram", "gpu_occupancy", "gpu_memory", "gpu_power", "gpu_clocks",
                   "step_time", "phases", "network", "disk", "cpu_mem")   # fake Hopper GPUs: GPM panels too


class Dom(HTMLParser):
    """Attributes of the elements with an id, the classes seen, canvases per plot."""

    def __init__(self, text: str):
        super().__init__()
        self.ids: dict[str, dict[str, str]] = {}
        self.findings = 0
        self.ready = False
        self.canvas: dict[str, int] = {}
        self._plot: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.ready = a.get("data-ready") == "1"
        if "id" in a:
            self.ids[a["id"]] = a
            if a["id"].startswith("plot-"):
                self._plot.append(a["id"])
        if "finding" in a.get("class", "").split():
            self.findings += 1
        if tag == "canvas" and self._plot:
            self.canvas[self._plot[-1]] = self.canvas.get(self._plot[-1], 0) + 1


def open_in_chromium(path, fragment: str = "") -> tuple[Dom, str]:
    proc = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom",
                           path.resolve().as_uri() + fragment], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Dom(proc.stdout), proc.stderr


def recorded_seconds(directory, rank: str, phase: str | None) -> float:
    db = sqlite3.connect(directory / "recording.sqlite")
    where = "json_extract(s.labels, '$.phase') = ?" if phase else "json_extract(s.labels, '$.phase') IS NULL"
    args = (rank, phase) if phase else (rank,)
    (ns,) = db.execute(f"SELECT sum(s.value) FROM samples s JOIN profiles p ON p.id = s.profile "
                       f"WHERE json_extract(p.labels, '$.rank') = ? AND {where}", args).fetchone()
    db.close()
    return (ns or 0) / 1e9


def busiest_phase(directory, rank: str) -> str:
    """The phase of ``rank`` with the most recorded profile time (the optimizer step of a tiny model
    can get no 100 Hz sample at all, so the test takes the phase the run actually sampled most)."""
    db = sqlite3.connect(directory / "recording.sqlite")
    rows = db.execute("SELECT json_extract(s.labels, '$.phase') AS ph, sum(s.value) FROM samples s "
                      "JOIN profiles p ON p.id = s.profile WHERE json_extract(p.labels, '$.rank') = ? "
                      "AND ph IS NOT NULL GROUP BY ph ORDER BY 2 DESC", (rank,)).fetchall()
    db.close()
    assert rows, f"no profile samples in any phase for rank {rank}"
    return rows[0][0]


def test_the_report_opens_offline_with_every_plot_findings_and_flame_graphs(two_rank_run):
    d = two_rank_run.directory
    report = d / "report.html"
    text = report.read_text()
    assert not re.search(r"""(src|href)=["']?https?://""", text), "the report loads something from the network"
    phase = busiest_phase(d, "1")
    dom, log = open_in_chromium(report, f"#rank=1&phase={phase}")
    assert dom.ready, "the page script did not run to its end"
    assert "data-count" not in dom.ids["errors"], dom.ids["errors"]
    assert not re.search(r"Uncaught|SyntaxError|TypeError|ReferenceError", log), log[-2000:]
    for pid in PLOTS_WITH_DATA:
        plot = dom.ids[f"plot-{pid}"]
        assert int(plot["data-points"]) > 0 and dom.canvas.get(f"plot-{pid}", 0) >= 1, (pid, plot)
    want = diagnose_recording([d]).findings
    assert dom.findings == len(want) == int(dom.ids["findings"]["data-count"])
    flame = dom.ids["flame"]
    assert (flame["data-rank"], flame["data-phase"]) == ("1", phase)
    assert float(flame["data-total"]) == pytest.approx(recorded_seconds(d, "1", phase), abs=1e-6)
    assert float(flame["data-total"]) > 0

    other, _ = open_in_chromium(report, "#rank=1&phase=(no phase)&own=1")   # with otel-gpu's own threads
    total = float(other.ids["flame"]["data-total"])
    assert other.ids["flame"]["data-phase"] == "(no phase)"
    assert total == pytest.approx(recorded_seconds(d, "1", None), abs=1e-6)
    assert total != pytest.approx(float(flame["data-total"]))


def test_the_report_of_a_run_fits_well_under_5_mb(two_rank_run):
    assert (two_rank_run.directory / "report.html").stat().st_size < 5_000_000


def test_names_holding_markup_and_a_deep_stack_still_show_findings_plots_and_flames(tmp_path):
    """A recording whose job, host and phase names hold `<!--`, `</script>`, an `<img onerror>`, U+2028,
    an escape sequence and `|`, and a profile stack 1200 frames deep (a recursive job): the page's data
    loads, every finding, the step, phase and CPU plots and the chosen phase's flame graph are shown."""
    import time
    from urllib.parse import quote

    from otel_gpu.cli import main
    from otel_gpu.record.decode import ProfileRows

    from .synth import write_node

    nasty = "<!--</script><img src=x onerror=alert(1)>\u2028\x1b[2J|&amp;"
    d, t0 = tmp_path / "run", time.time() - 100
    d.mkdir()
    phase = "fwd|" + nasty
    stack = tuple(f"f{i}{nasty if i == 600 else ''}" for i in range(1200))
    deep = ProfileRows({"rank": "0", "node": "node" + nasty, "job": "job" + nasty}, t0, t0 + 5, "wall", "nanoseconds",
                       10_000_000, [(stack, (("phase", phase),), 3_000_000_000)])
    write_node(d, "node" + nasty, [0, 1], 1, t0, 20, data_wait_share=0.6, job="job" + nasty, profiles=[deep])
    report = tmp_path / "r.html"
    assert main(["report", str(d), "-o", str(report)]) == 0
    assert "<img" not in report.read_text()
    dom, log = open_in_chromium(report, "#rank=0&phase=" + quote(phase, safe=""))
    assert dom.ready, "the page script did not run to its end"
    assert "data-count" not in dom.ids["errors"], dom.ids["errors"]
    assert not re.search(r"Uncaught|SyntaxError|TypeError|ReferenceError|RangeError", log), log[-2000:]
    want = diagnose_recording([d]).findings
    assert want and dom.findings == len(want) == int(dom.ids["findings"]["data-count"])
    for pid in ("step_time", "phases", "cpu_mem", "gpu"):
        assert int(dom.ids[f"plot-{pid}"]["data-points"]) > 0 and dom.canvas.get(f"plot-{pid}", 0) >= 1, pid
    flame = dom.ids["flame"]
    assert (flame["data-rank"], flame["data-phase"]) == ("0", phase)
    assert float(flame["data-total"]) == pytest.approx(3.0)
