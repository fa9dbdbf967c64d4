"""The capture's background write (gzip, rename): written whole, or dropped at exit or on an error with
nothing left behind; `done` told once either way."""
from __future__ import annotations

import gzip
import os

from otel_gpu.training.trace_writer import Cancelled, Writer


def _writer(tmp_path, data: bytes, calls: list, tmp_dir=None) -> Writer:
    src = tmp_path / ".t.json.tmp"
    src.write_bytes(data)
    tmp = (tmp_dir or tmp_path) / ".t.gz.tmp"
    return Writer(src, tmp, tmp_path / "t.json.gz", lambda s, e: calls.append((s, e)))


def test_written_whole_and_renamed(tmp_path):
    calls: list = []
    data = b'{"traceEvents": []}' * 1000
    w = _writer(tmp_path, data, calls)
    w.start()
    assert w.finish(30)
    with gzip.open(tmp_path / "t.json.gz", "rb") as f:
        assert f.read() == data
    assert os.listdir(tmp_path) == ["t.json.gz"] and len(calls) == 1 and calls[0][1] is None and calls[0][0] > 0


def test_dropped_at_exit_leaves_nothing(tmp_path):
    calls: list = []
    w = _writer(tmp_path, os.urandom(16 << 20), calls)   # ~0.3 s of gzip: still going when finish(0) cancels it
    w.start()
    assert w.finish(0)
    assert os.listdir(tmp_path) == [] and len(calls) == 1 and isinstance(calls[0][1], Cancelled)


def test_a_failed_write_is_said_once_and_leaves_nothing(tmp_path):
    calls: list = []
    w = _writer(tmp_path, b"{}", calls, tmp_dir=tmp_path / "gone")   # the temporary file cannot be made
    w.start()
    assert w.finish(30)
    assert os.listdir(tmp_path) == [] and len(calls) == 1 and isinstance(calls[0][1], FileNotFoundError)
