"""Trace inputs no profiler writes: values nested thousands of levels deep (bad input, exit 2, one
line naming the file) and folder entries named like traces that are not files (a named pipe, a
looping or dangling link, a folder): each skipped with a note saying why, a pipe never opened."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.trace.listing import list_traces
from otel_gpu.trace.parse import TraceFormatError, read_trace
from tests.childenv import REPO, clean_env

from kineto import training_trace

CLEAN = REPO / "tests/data/traces/cpu_gloo_clean"
CLI = [sys.executable, "-m", "otel_gpu", "trace"]


def _deep(depth: int, kind: str) -> str:
    return ('{"a":' * depth + "1" + "}" * depth) if kind == "object" else ("[" * depth + "]" * depth)


def _trace_with_deep_value(path: Path, depth: int, at: int, place: str, kind: str = "object") -> Path:
    """A crafted 4-step trace whose event number `at` (or the top-level object) holds one value
    nested `depth` levels deep: in its args, as an extra event field, or in the trace's metadata."""
    b = training_trace()
    at = at % len(b.events)
    if place == "args":
        b.events[at].setdefault("args", {})["deep"] = "@DEEP@"
    elif place == "event":
        b.events[at]["extra"] = "@DEEP@"
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": b.events}
    if place == "meta":
        doc["deviceProperties"] = "@DEEP@"
    path.write_text(json.dumps(doc).replace('"@DEEP@"', _deep(depth, kind)))
    return path


@settings(max_examples=25, deadline=None)
@given(depth=st.integers(3_000, 30_000), at=st.integers(0, 10_000),
       place=st.sampled_from(["args", "event", "meta"]), kind=st.sampled_from(["object", "array"]))
def test_deep_nesting_is_a_format_error_naming_the_file(depth, at, place, kind):
    with tempfile.TemporaryDirectory() as d:
        path = _trace_with_deep_value(Path(d) / "rank0.json", depth, at, place, kind)
        with pytest.raises(TraceFormatError) as exc:
            read_trace(str(path))
        assert str(path) in str(exc.value) and "nested too deeply" in str(exc.value)


@pytest.mark.parametrize("backend", ["", "orjson", "json"])
def test_deep_args_exit_2_in_one_line_with_every_decoder(tmp_path, backend):
    d = tmp_path / "run"
    d.mkdir()
    _trace_with_deep_value(d / "rank0.pt.trace.json", 5_000, 17, "args")
    out = tmp_path / "o.json"
    done = subprocess.run(CLI + ["analyze", str(d), "--json", str(out)], env=clean_env(OTELGPU_TRACE_JSON=backend),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "rank0.pt.trace.json" in err and "internal error" not in err
    assert not out.exists()


def _odd_folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The two clean ranks plus entries named like traces that are not files: name -> why skipped."""
    d = tmp_path / "run"
    shutil.copytree(CLEAN, d)
    os.mkfifo(d / "rank2.pt.trace.json")
    os.symlink("loop.json", d / "loop.json")
    (d / "rank3.pt.trace.json").mkdir()
    os.symlink("gone.json.gz", d / "rank4.pt.trace.json.gz")
    return d, {"rank2.pt.trace.json": "named pipe", "loop.json": "loops", "rank3.pt.trace.json": "a folder",
               "rank4.pt.trace.json.gz": "does not exist"}


def test_odd_entries_are_noted_and_a_pipe_is_never_opened(tmp_path):
    d, odd = _odd_folder(tmp_path)
    out = tmp_path / "o.json"
    # a pipe opened for reading blocks until a writer comes: the timeout would end the test
    done = subprocess.run(CLI + ["analyze", str(d), "--quiet", "--json", str(out)], env=clean_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["ranks"] == [0, 1]
    for name, why in odd.items():
        notes = [n for n in doc["notes"] if n.startswith(str(d / name) + ":")]
        assert len(notes) == 1 and why in notes[0] and "not analysed" in notes[0], (name, doc["notes"])


def test_odd_entries_are_noted_in_a_diff(tmp_path):
    d, odd = _odd_folder(tmp_path)
    out = tmp_path / "diff.json"
    done = subprocess.run(CLI + ["diff", str(CLEAN), str(d), "--quiet", "--json", str(out)], env=clean_env(),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    notes = json.loads(out.read_text())["notes"]
    assert all(any(n.startswith(f"B: {d / name}:") for n in notes) for name in odd), notes


def test_a_folder_of_only_odd_entries_is_refused_saying_why(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    os.mkfifo(d / "rank0.json")
    (d / "rank1.json").mkdir()
    done = subprocess.run(CLI + ["analyze", str(d)], env=clean_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert "named pipe" in err and "a folder" in err


ENTRY = st.sampled_from(["file", "link", "fifo", "folder", "loop", "dangling", "other_name"])


@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(ENTRY, min_size=1, max_size=8), suffix=st.sampled_from([".json", ".json.gz", ".gz"]))
def test_listing_keeps_files_and_notes_every_other_entry(kinds, suffix):
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "elsewhere.txt").write_text("{}")
        want, skipped = [], []
        for i, kind in enumerate(kinds):
            p = Path(d) / f"e{i}{'.txt' if kind == 'other_name' else suffix}"
            if kind == "file":
                p.write_text("{}")
            elif kind == "link":
                p.symlink_to(Path(d) / "elsewhere.txt")
            elif kind == "fifo":
                os.mkfifo(p)
            elif kind == "folder":
                p.mkdir()
            elif kind == "loop":
                p.symlink_to(p.name)
            elif kind == "dangling":
                p.symlink_to(Path(d) / "nowhere")
            if kind in ("file", "link"):
                want.append(str(p))
            elif kind != "other_name":
                skipped.append(str(p))
        files, notes = list_traces(d)
        assert files == sorted(want)
        assert [n.split(": skipped", 1)[0] for n in notes] == sorted(skipped)
