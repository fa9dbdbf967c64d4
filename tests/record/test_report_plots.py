"""The report's plots from small recordings of known content: GPU panels say why when a metric was not
recorded, a run without GPUs says "no GPU recorded" once, phases keep their colours."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from otel_gpu import names as N
from otel_gpu.record.reader import Recording
from otel_gpu.report import data as rd

from .synth import write_node

PAGE_JS = Path(rd.__file__).with_name("page.js")


def plots_of(directory: Path) -> dict[str, dict]:
    with Recording.open([directory]) as rec:
        start, end = rec.span()
        return {p["id"]: p for p in rd.plots(rec, start, end)}


def test_a_run_without_gpus_says_no_gpu_recorded_once_and_draws_no_gpu_panel(tmp_path):
    write_node(tmp_path / "cpu", "node-a", [0, 1], gpus=0, t0=time.time() - 600, seconds=20)
    plots = plots_of(tmp_path / "cpu")
    gpu = [p for pid, p in plots.items() if pid.startswith("gpu")]
    assert [p["id"] for p in gpu] == ["gpu"]
    assert gpu[0]["empty"].startswith("no GPU recorded") and not gpu[0]["series"]
    words = json.dumps([p for pid, p in plots.items() if not pid.startswith("gpu")])
    assert "GPU" not in words, "GPU words in a run without GPUs"
    assert plots["step_time"]["series"] and plots["phases"]["series"]


def test_gpu_panels_without_gpm_say_why_and_the_nvml_ones_draw(tmp_path):
    write_node(tmp_path / "g", "node-a", [0], gpus=2, t0=time.time() - 600, seconds=20)   # no GPM fields written
    plots = plots_of(tmp_path / "g")
    for pid in ("gpu_tensor", "gpu_dram", "gpu_occupancy"):
        assert plots[pid]["empty"].startswith("not recorded: the node agent read no GPM metrics"), plots[pid]
    mem = plots["gpu_memory"]
    assert [s["label"] for s in mem["series"]] == ["gpu0 used", "gpu0 size", "gpu1 used", "gpu1 size"]
    assert [s["group"] for s in mem["series"]] == ["gpu0", "gpu0", "gpu1", "gpu1"]
    sizes = [v for s in mem["series"] if s["label"].endswith("size") for v in s["values"]]
    assert {v for v in sizes if v is not None} == {8e10}
    assert sizes.count(None) <= 2 * 3, "a gauge holds from one export back to the one before, no further"
    assert "empty" not in mem
    assert plots["gpu_power"]["empty"] == "not recorded: no GPU power reading"


def test_every_documented_phase_has_one_fixed_colour_and_unphased_is_grey():
    text = PAGE_JS.read_text()
    table = re.search(r"const PHASE_COLORS = \{(.*?)\};", text, re.S).group(1)
    colours = dict(re.findall(r'(\w+): "(#[0-9a-f]{6})"', table))
    assert set(N.PHASE_NAMES) | {rd.UNPHASED} <= set(colours)
    assert len({colours[p] for p in N.PHASE_NAMES}) == len(N.PHASE_NAMES)
    grey = colours[rd.UNPHASED]
    assert grey[1:3] == grey[3:5] == grey[5:7], "unphased is a neutral grey"
    assert "#d62728" not in colours.values(), "no phase in red (red shades the findings)"
