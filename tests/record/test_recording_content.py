"""Recordings whose content is not what the store writes, as `diagnose` and `report` read them:
NaN and infinite points are left out and counted in one note; a meta time that is no number, a
command, attributes or labels that are no JSON, a point value that is text, a stack that is no list,
a missing table: one "unreadable" line and exit 1, never an internal error; a profile stack 1200
frames deep makes a report."""
from __future__ import annotations

import json
import re
import sqlite3
import time

import pytest

from otel_gpu.cli import main
from otel_gpu.record.decode import Point, ProfileRows
from otel_gpu.record.store import Writer

STEPS = "otelgpu.train.steps"


def _write(directory, values, *, close: bool = True, deep: int = 0) -> None:
    """One rank's step counter (one point a second, the `values`), a CPU gauge, and with `deep` one
    profile of a stack that many frames deep."""
    t0 = time.time() - 100
    w = Writer(directory, {"job": "j", "host": "h", "started": repr(t0), "exit_status": "0",
                           "command": '["python", "train.py"]'})
    res, a = (("host.name", "h"), ("otelgpu.job", "j")), (("otelgpu.rank", "0"),)
    w.add_points([Point(STEPS, "counter", "{step}", "cumulative", res, a, t0 + i + 1, v) for i, v in enumerate(values)]
                 + [Point("system.cpu.utilization", "gauge", "1", "", res, (("cpu.mode", "idle"),), t0 + i + 1, 0.5)
                    for i in range(len(values))])
    if deep:
        w.add_profiles([ProfileRows({"rank": "0", "node": "h", "job": "j"}, t0, t0 + 5, "wall", "nanoseconds",
                                    10_000_000, [(tuple(f"f{i}" for i in range(deep)), (), 2_000_000_000)])])
    if close:
        w.set_meta({"ended": repr(t0 + len(values) + 1)})
        w.close()
    else:
        w.db.close()   # cut off: no statistics written


@pytest.mark.parametrize("close", [True, False], ids=["closed", "cut-off"])
def test_nan_and_infinite_points_are_left_out_and_counted(tmp_path, capsys, close):
    values = [float(i) for i in range(20)]
    values[3], values[7], values[11] = float("nan"), float("inf"), float("-inf")
    _write(tmp_path / "r", values, close=close)
    assert main(["diagnose", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "note: 3 recorded points were NaN or infinite: left out" in out
    assert main(["report", str(tmp_path / "r"), "-o", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    assert "note: 3 recorded points were NaN or infinite: left out" in out and "rank 0" in out
    page = (tmp_path / "r.html").read_text()
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1))
    assert "3 recorded points were NaN or infinite" in data["subtitle"]


def test_a_clean_recording_has_no_such_note(tmp_path, capsys):
    _write(tmp_path / "r", [float(i) for i in range(10)])
    assert main(["diagnose", str(tmp_path / "r")]) == 0
    assert "NaN" not in capsys.readouterr().out


DAMAGE = {
    "start is no number": "UPDATE meta SET value = 'yesterday' WHERE key = 'started'",
    "end is infinite": "UPDATE meta SET value = 'inf' WHERE key = 'ended'",
    "command is no JSON": "UPDATE meta SET value = 'python train.py' WHERE key = 'command'",
    "command is no list of strings": "UPDATE meta SET value = '[1, 2]' WHERE key = 'command'",
    "attributes are no JSON": "UPDATE series SET attrs = '{\"otelgpu.rank\": ' WHERE id = 1",
    "resource attributes are a list": "UPDATE resources SET attrs = '[1, 2]'",
    "a point value is text": "UPDATE points SET value = 'many' WHERE t = (SELECT max(t) FROM points)",
    "a statistic is text": "UPDATE series_stats SET mean = 'many'",
    "a stack is no list": "UPDATE stacks SET frames = 'main'",
    "sample labels are no JSON": "UPDATE stack_totals SET sample_labels = 'phase=x'",
    "no points table": "DROP TABLE points",
}


@pytest.mark.parametrize("sql", DAMAGE.values(), ids=DAMAGE.keys())
def test_damaged_content_is_one_unreadable_line(tmp_path, capsys, sql):
    d = tmp_path / "r"
    _write(d, [float(i) for i in range(10)], deep=3)
    db = sqlite3.connect(d / "recording.sqlite")
    db.execute(sql)
    db.commit()
    db.close()
    for args in (["diagnose", str(d)], ["report", str(d), "-o", str(tmp_path / "r.html")]):
        assert main(args) == 1, args
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "unreadable" in err and "internal error" not in err, err
        assert not (tmp_path / "r.html").exists()


def test_a_stack_1200_frames_deep_makes_a_report(tmp_path, capsys):
    """A recursive job's stack (within Python's recursion limit where it was sampled) is no RecursionError."""
    _write(tmp_path / "r", [float(i) for i in range(10)], deep=1200)
    assert main(["report", str(tmp_path / "r"), "-o", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    flames = json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1))["flames"]
    (tree,) = flames["trees"].values()
    assert len(tree) == 3 * 1201 and tree[1] == 2_000_000_000   # the root and 1200 frames, one child each
    assert [flames["names"][i] for i in tree[3::3][:3]] == ["f0", "f1", "f2"] and tree[2::3] == [1] * 1200 + [0]

