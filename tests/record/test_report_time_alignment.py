"""A recorded job that saves checkpoints at times it chooses and measures (tests/record/ckpt_times_job.py,
no otel-gpu import, different steps on each rank): in its report every save is shaded where the script
says it ran, the checkpoint phase is drawn inside those saves, the slow steps that hold a save are drawn
where they ran (not an export interval later), and the time axis starts at the first step."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from .conftest import HERE, record, torchrun
from .test_report_browser import open_in_chromium

pytestmark = pytest.mark.slow
EXPORT_S = 1.0   # a recorded run's export interval: what a drawn value may be off by
SLACK_S = EXPORT_S + 0.25   # ... plus one plot cell


def report_data(path) -> dict:
    text = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', path.read_text(), re.S).group(1)
    return json.loads(text.replace("<\\!--", "<!--"))


@pytest.fixture(scope="module")
def ckpt_run(tmp_path_factory):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    base = tmp_path_factory.mktemp("ckpt")
    out = base / "truth"
    run = record(base / "run", torchrun(HERE / "ckpt_times_job.py", str(out), "70", "3"), "--agent-arg=--fake-gpus=2")
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    truth = {str(t["rank"]): t for t in (json.loads((base / f"truth.{r}.json").read_text()) for r in (0, 1))}
    return run, truth, report_data(run.directory / "report.html")


def plot_of(data: dict, pid: str) -> dict:
    return next(p for p in data["plots"] if p["id"] == pid)


def cells(p: dict, label: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cell starts, cell ends, values) of one series (NaN where None)."""
    x = np.asarray(p["x"], dtype=float)
    v = next(s["values"] for s in p["series"] if s["label"] == label)
    return x[:-1], x[1:], np.asarray([np.nan if y is None else y for y in v[:-1]], dtype=float)


def overlap(a0, a1, b0, b1):
    return np.maximum(0.0, np.minimum(a1, b1) - np.maximum(a0, b0))


def test_every_save_is_shaded_where_the_script_measured_it(ckpt_run):
    _, truth, data = ckpt_run
    bands = plot_of(data, "phases")["bands"]
    assert all(p["bands"] == bands for p in data["plots"]), "every plot shades the same saves"
    saves = [s for t in truth.values() for s in t["saves"]]
    assert len(saves) == 6
    for a, b in saves:
        hit = [x for x in bands if x["from"] <= b and x["to"] >= a]
        assert hit, f"save {a:.2f}-{b:.2f} not shaded; bands {bands}"
        assert any(x["from"] <= a + 0.2 and x["to"] >= b - 0.2 for x in hit), (a, b, hit)
    for x in bands:   # overlapping saves of several ranks are one band: its edges are some save's edges
        assert min(abs(x["from"] - a) for a, _ in saves) < 0.2 and min(abs(x["to"] - b) for _, b in saves) < 0.2, x
    # as many bands as the script's saves make when overlapping ones are joined (where two saves of different
    # ranks are within 0.2 s of touching, either count is right)
    assert merged_count(saves, 0.2) <= len(bands) <= merged_count(saves, -0.2), (saves, bands)


def merged_count(spans, gap: float) -> int:
    """How many groups spans make when one that starts less than `gap` s after the group's end joins it."""
    count, end = 0, None
    for a, b in sorted(spans):
        if end is None or a - end >= gap:
            count += 1
            end = b
        else:
            end = max(end, b)
    return count


def test_the_checkpoint_phase_is_drawn_inside_the_saves(ckpt_run):
    _, truth, data = ckpt_run
    p = plot_of(data, "phases")
    labels = [s["label"] for s in p["series"]]
    assert "checkpoint" in labels
    lo, hi, share = cells(p, "checkpoint")                   # the checkpoint band's own share (drawn stacked)
    share = np.nan_to_num(share)
    drawn = share * (hi - lo)                                # share-seconds per cell
    saves = [s for t in truth.values() for s in t["saves"]]
    ranks = len(truth)
    want = sum(b - a for a, b in saves) / ranks               # all ranks' save time as a share of their wall time
    assert drawn.sum() == pytest.approx(want, rel=0.25)
    near = np.zeros(len(lo), dtype=bool)
    for a, b in saves:
        near |= overlap(lo, hi, a - SLACK_S, b + SLACK_S) > 0
        inside = (drawn * (overlap(lo, hi, a, b) / (hi - lo))).sum()
        assert inside >= 0.5 * (b - a) / ranks, f"save {a:.2f}-{b:.2f}: only {inside:.2f} share-s of checkpoint inside it"
    assert drawn[near].sum() >= 0.9 * drawn.sum(), "checkpoint time drawn away from the saves"


def test_slow_steps_are_drawn_where_they_ran(ckpt_run):
    _, truth, data = ckpt_run
    p = plot_of(data, "step_time")
    for rank, t in truth.items():
        lo, hi, v = cells(p, f"rank {rank}")
        spans = np.asarray(t["steps"])
        normal = float(np.median(spans[:, 1] - spans[:, 0]))
        # a value is the mean of the steps that ended in one export interval: one slow step among ~15
        # normal ones still more than doubles it
        high = np.nan_to_num(v) > 2 * normal
        slow = [(a, b) for a, b in spans if b - a > 1.0]      # the steps that hold a save
        assert len(slow) == len(t["saves"]), (rank, slow)
        claimed = np.zeros(len(lo), dtype=bool)
        for a, b in slow:
            around = overlap(lo, hi, a - SLACK_S, b + SLACK_S) > 0
            assert (high & (overlap(lo, hi, a, b) > 0)).sum() * (hi - lo)[0] >= 0.5 * (b - a), \
                f"rank {rank}: the slow step {a:.2f}-{b:.2f} is not drawn over most of its time"
            claimed |= around
        stray = high & ~claimed
        assert not stray.any(), f"rank {rank}: slow step time drawn away from any slow step at {lo[stray][:5]}"


def test_the_time_axis_starts_at_the_first_step_with_start_up_left_out(ckpt_run):
    run, truth, data = ckpt_run
    first = min(t["steps"][0][0] for t in truth.values())   # the first counted step's start (script's clock)
    axis = plot_of(data, "gpu")["axis"]
    assert axis["basis"] == "first step"
    # time 0 is the first counted step's start, estimated from the first export (the step time counted by
    # then, back from it): late by at most the step in progress at that export, within the sampling interval
    assert first - 0.15 <= axis["t0"] <= first + EXPORT_S
    assert all(p["x"][0] == pytest.approx(axis["t0"], abs=1e-3) for p in data["plots"])
    assert axis["startup_s"] == pytest.approx(axis["t0"] - data["start"], abs=1e-2) and axis["startup_s"] > 0
    dom, log = open_in_chromium(run.directory / "report.html")
    assert dom.ready and "data-count" not in dom.ids["errors"], log[-2000:]
    assert float(dom.ids["plots-note"]["data-t0"]) == pytest.approx(axis["t0"], abs=1e-3)
    # which saves of different ranks overlap depends on this machine's speed: the band count is checked
    # against the script's saves above; here the page must draw every band the data holds
    assert int(dom.ids["plot-phases"]["data-bands"]) == len(plot_of(data, "phases")["bands"]) >= 1
