"""Each rank read and analysed in the worker that read it: the same document as reading every rank
here first, the same errors, and a worker that dies or fails is said, never waited on."""
import os
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.trace import analyze as A
from otel_gpu.trace.model import load_set
from otel_gpu.trace.parse import RankEvents, TraceFormatError
from otel_gpu.trace.set_workers import WorkerFailed, _held, _restored, analyze_folder, shares
from tests.shared_data import needs_shared_data, shared_data

SAMPLED = shared_data("traces") / "hta_sampled_2rank"


@pytest.fixture
def three_files(tmp_path):
    """Rank 0 twice (the later file wins) and rank 1."""
    src = sorted(SAMPLED.iterdir())
    shutil.copy(src[0], tmp_path / "a_rank0.json.gz")
    shutil.copy(src[1], tmp_path / "b_rank1.json.gz")
    shutil.copy(src[0], tmp_path / "c_rank0_again.json.gz")
    return tmp_path


@needs_shared_data("traces", "hta_sampled_2rank")
@pytest.mark.parametrize("ranks, last", [(None, False), ([1], False), (None, True)])
def test_same_document_as_one_process(three_files, ranks, last):
    opts = A.Options(kernel_sequences=("aten::",))
    here = A.analyze(load_set(str(three_files), ranks, last), opts, jobs=1)
    there = analyze_folder(str(three_files), opts, ranks, last, jobs=2, gpu_time=True)
    assert A.jsonable(there) == A.jsonable(here)
    assert sorted(there["_gpu_time"]) == (ranks or [0, 1]) and all(there["_gpu_time"].values())
    if ranks is None:
        assert any("rank 0 appears in" in n and n.endswith("c_rank0_again.json.gz") for n in there["notes"])


@needs_shared_data("traces", "hta_sampled_2rank")
def test_first_unreadable_file_in_folder_order_is_named(three_files):
    (three_files / "b0_bad.json").write_text('{"traceEvents": [{"ph": "X", ')
    (three_files / "d_bad.json").write_text("not json")
    with pytest.raises(TraceFormatError) as here:
        load_set(str(three_files))
    with pytest.raises(TraceFormatError) as there:
        analyze_folder(str(three_files), jobs=2)
    assert str(there.value) == str(here.value) and "b0_bad.json" in str(there.value)
    with pytest.raises(TraceFormatError, match="no trace for rank 7"):
        analyze_folder(str(SAMPLED), ranks=[7], jobs=2)


@needs_shared_data("traces", "hta_sampled_2rank")
@pytest.mark.parametrize("how, said", [("kill", "killed by signal 9"), ("raise", "ValueError: odd rank")])
def test_a_worker_that_dies_or_fails_is_said(three_files, monkeypatch, how, said):
    def broken(v, *args, **kwargs):
        if v.rank == 1:
            if how == "kill":
                os.kill(os.getpid(), 9)
            raise ValueError("odd rank")
        return real(v, *args, **kwargs)

    real = A.one_rank
    monkeypatch.setattr(A, "one_rank", broken)
    with pytest.raises(WorkerFailed, match=said):
        analyze_folder(str(three_files), jobs=2)


@needs_shared_data("traces", "hta_sampled_2rank")
def test_cli_says_a_failed_worker_in_one_line_and_writes_nothing(three_files, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(A, "one_rank", lambda *a, **k: os.kill(os.getpid(), 9))
    out = tmp_path / "out"
    assert main(["trace", "analyze", str(three_files), "--jobs", "2", "--csv", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["otel-gpu trace: a worker process ended without its results (killed by signal 9)"]
    assert not out.exists()


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=60), st.integers(1, 8))
def test_shares_hand_out_every_file_once_balanced(sizes, jobs):
    parts = shares(sizes, jobs)
    assert sorted(i for p in parts for i in p) == list(range(len(sizes)))
    assert all(p == sorted(p) and p for p in parts) and len(parts) <= jobs
    loads = [sum(max(sizes[i], 1) for i in p) for p in parts]
    if len(parts) == jobs:   # largest first to the least loaded: no share exceeds another by more than a file
        assert max(loads) - min(loads) <= max(max(s, 1) for s in sizes)


@given(st.lists(st.tuples(st.integers(-(1 << 62), 1 << 62), st.floats(0, 1e12, allow_nan=False)), max_size=30),
       st.integers(0, 1 << 33))
def test_a_held_rank_comes_back_as_it_was_read(events, spread):
    """While a rank waits for the set's start its times are held narrower where exact; restored,
    every array is the one read (dtype included)."""
    ts = np.array([t % (spread + 1) + (events[0][0] if events else 0) for t, _ in events], dtype=np.int64)
    dur = np.array([d for _, d in events], dtype=np.float64)
    z = np.zeros(len(events), dtype=np.int32)
    ev = RankEvents("f", 0, z, ts.copy(), dur.copy(), z, z, z, z, z, [], meta={"k": 1})
    back = _restored(*_held(ev))
    assert back.ts.dtype == np.int64 and np.array_equal(back.ts, ts)
    assert back.dur.dtype == np.float64 and np.array_equal(back.dur, dur) and back.meta == {"k": 1}
