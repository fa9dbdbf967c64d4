"""A recording's hard cases: written by another format version (refused, exit 2, one line saying
which version this otel-gpu reads) and a disk that fills up while recording (one line naming the
folder and the problem; what was recorded is kept; the command's own failure status wins)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.record import decode
from otel_gpu.record.reader import Recording, RecordingVersionError
from otel_gpu.record.session import RecordedRun, RecordingDiskFull
from otel_gpu.record.store import DB_NAME, DISK_FULL, VERSION, DiskError, Writer
from tests.childenv import clean_env

from .conftest import HERE, REPO, RUN
from .otlp_bodies import body
from .synth import write_node


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("versions") / "run"
    write_node(d, "n1", [0], 1, time.time() - 100, 6)
    return d


def _set_version(d: Path, version: str | None) -> None:
    with sqlite3.connect(d / DB_NAME) as db:
        if version is None:
            db.execute("DELETE FROM meta WHERE key = 'version'")
        else:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('version', ?)", (version,))
    db.close()


@pytest.mark.parametrize("version", ["2", "999abc", None])
@pytest.mark.parametrize("command", ["report", "diagnose"])
def test_another_format_version_is_refused_in_one_line(recording, tmp_path, capsys, version, command):
    _set_version(recording, version)
    try:
        extra = ["-o", str(tmp_path / "r.html")] if command == "report" else []
        assert main([command, str(recording), *extra]) == 2
    finally:
        _set_version(recording, VERSION)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"reads version {VERSION} only" in err and DB_NAME in err, err
    assert not (tmp_path / "r.html").exists()
    assert main([command, str(recording), *extra]) == 0   # the same recording at its own version reads


@settings(max_examples=40, deadline=None)
@given(version=st.text(max_size=12).filter(lambda v: v != VERSION))
def test_only_this_version_opens(recording, version):
    _set_version(recording, version)
    try:
        with pytest.raises(RecordingVersionError):
            Recording.open([recording]).close()
    finally:
        _set_version(recording, VERSION)


def _points_body(n: int, seq: int) -> bytes:
    """One OTLP request of `n` counter series (real SDK encoding)."""
    def record(meter):
        c = meter.create_counter("otelgpu.train.steps")
        for i in range(n):
            c.add(seq + 1, {"otelgpu.rank": str(i), "pad": "x" * 200})
    return body(record)


def test_a_full_store_is_a_disk_error_and_keeps_what_was_committed(tmp_path):
    """SQLite's own "database or disk is full" (a page limit on the file), not a mocked error."""
    w = Writer(tmp_path)
    w.add_points(decode.otlp_points(_points_body(5, 0)))
    pages = w.db.execute("PRAGMA page_count").fetchone()[0]
    w.db.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(DiskError) as exc:
        for seq in range(1, 50):
            w.add_points(decode.otlp_points(_points_body(300, seq)))
    assert exc.value.problem == DISK_FULL and str(tmp_path) in str(exc.value)
    try:
        w.close()
    except DiskError as late:   # the statistics may not fit either: the connection is closed all the same
        assert late.problem == DISK_FULL
    with pytest.raises(sqlite3.ProgrammingError):
        w.db.execute("SELECT 1")
    with Recording.open([tmp_path]) as rec:
        assert sorted(s.get("otelgpu.rank") for s in rec.series("otelgpu.train.steps")) == [str(i) for i in range(5)]


def test_a_recorded_run_whose_disk_fills_says_so_once_at_its_end(tmp_path):
    """The real receiver and store of a run: exports into a full store are answered (no error per export
    in the training's output), counted, and `finish` raises one line naming the folder."""
    d = tmp_path / "run"
    run = RecordedRun(d, "job", ["python", "train.py"], clean_env())
    pages = run.writer.db.execute("PRAGMA page_count").fetchone()[0]
    run.writer.db.execute(f"PRAGMA max_page_count = {pages + 3}")
    key = run.child_env({})["OTELGPU_RECORD_KEY"]   # what the ranks send (the receiver takes this run's only)
    codes = [httpx.post(run.receiver.url + "/v1/metrics", content=_points_body(300, seq),
                        headers={"content-type": "application/x-protobuf", "x-otelgpu-key": key}, timeout=30).status_code
             for seq in range(20)]
    assert codes == [200] * 20
    assert run.receiver.counts.lost_requests > 0 and run.receiver.disk_error is not None
    with pytest.raises(RecordingDiskFull) as exc:
        run.finish(0)
    text = str(exc.value)
    assert str(d.name) in text and "disk is full" in text and "kept" in text and "\n" not in text
    Recording.open([d]).close()   # what was committed opens


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MB file system (tmpfs), so that the disk truly fills up; needs root and mount rights."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("status", [3, 0])
def test_a_disk_full_during_the_run_is_one_line_and_the_status_passes(small_disk, status):
    pytest.importorskip("torch", reason="torch not installed")
    rec = small_disk / "rec"
    done = subprocess.run(RUN + ["--record", str(rec), "--no-agent", "--", sys.executable,
                                 str(HERE / "fill_disk_job.py"), str(small_disk), str(status)],
                          env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=240)
    assert "filled" in done.stdout and "finished" in done.stdout, done.stdout + done.stderr   # the job ran on
    assert done.returncode == (status or 1), done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("otel-gpu")]
    assert len(ours) == 1 and "internal error" not in done.stderr, done.stderr
    assert "rec" in ours[0] and "disk is full" in ours[0] and "kept" in ours[0], ours
    (small_disk / "ballast").unlink()   # space again: what was recorded reads
    with Recording.open([rec]) as recording:
        assert recording.series("otelgpu.train.steps"), "nothing of the run before the disk filled"
