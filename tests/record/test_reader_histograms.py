"""Reading histogram buckets out of a recording, and a recording named twice counted once."""
from __future__ import annotations

import shutil

import pytest

from otel_gpu.record.decode import Point
from otel_gpu.record.reader import Recording, RecordingError
from otel_gpu.record.store import Writer

BOUNDS = (0.1, 1.0)
RES = (("host.name", "n1"),)


def hist(t: float, counts, temporality="cumulative", rank="0") -> Point:
    return Point("otelgpu.train.step.duration", "histogram", "s", temporality, RES, (("otelgpu.rank", rank),), t,
                 value=0.0, count=float(sum(counts)), buckets=tuple(counts), bounds=BOUNDS)


def recording(tmp_path, points, name="r") -> Recording:
    w = Writer(tmp_path / name, {"job": "j", "host": "n1", "started": "100.0", "ended": "200.0"})
    w.add_points(points)
    w.close()
    return Recording.open([tmp_path / name])


def test_cumulative_counts_are_the_last_point_less_the_one_before_the_window(tmp_path):
    with recording(tmp_path, [hist(101, [1, 0, 0]), hist(102, [3, 1, 0]), hist(103, [3, 4, 1])]) as rec:
        ((s, bounds, counts),) = rec.histograms("otelgpu.train.step.duration")
        assert (s.get("otelgpu.rank"), bounds, counts) == ("0", BOUNDS, [3, 4, 1])
        ((_, _, counts),) = rec.histograms("otelgpu.train.step.duration", 101, 102.5)
        assert counts == [2, 1, 0]


def test_delta_counts_are_summed_over_the_window(tmp_path):
    pts = [hist(101, [1, 0, 0], "delta"), hist(102, [2, 1, 0], "delta"), hist(103, [0, 3, 1], "delta")]
    with recording(tmp_path, pts) as rec:
        ((_, _, counts),) = rec.histograms("otelgpu.train.step.duration")
        assert counts == [3, 4, 1]
        ((_, _, counts),) = rec.histograms("otelgpu.train.step.duration", 101.5, 103)
        assert counts == [2, 4, 1]


def test_a_directory_given_twice_is_read_once_and_a_copy_is_refused(tmp_path):
    recording(tmp_path, [hist(101, [1, 2, 0])]).close()
    with Recording.open([tmp_path / "r", tmp_path / "r", tmp_path / "." / "r"]) as rec:
        assert len(rec.dbs) == 1
        assert [c for _, _, c in rec.histograms("otelgpu.train.step.duration")] == [[1, 2, 0]]
    shutil.copytree(tmp_path / "r", tmp_path / "copy")
    with pytest.raises(RecordingError, match="copies of one recording"):
        Recording.open([tmp_path / "r", tmp_path / "copy"])


def test_a_damaged_bucket_row_is_left_out(tmp_path):
    recording(tmp_path, [hist(101, [1, 0, 0]), hist(102, [3, 1, 0])]).close()
    import sqlite3
    db = sqlite3.connect(tmp_path / "r" / "recording.sqlite")
    db.execute("UPDATE points SET buckets = '[3, 1' WHERE t = 102")
    db.commit()
    db.close()
    with Recording.open([tmp_path / "r"]) as rec:
        ((_, _, counts),) = rec.histograms("otelgpu.train.step.duration")
        assert counts == [1, 0, 0]     # the last readable point
