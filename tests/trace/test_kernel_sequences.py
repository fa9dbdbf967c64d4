"""Frequent CUDA kernel sequences: parity with HTA 0.5.0's get_frequent_cuda_kernel_sequences on
every shared trace set, rank and operator of tests/data/hta_extra (made by
make_reference_callgraph.py), the call-stack order and walk against brute force, and the flags."""
import argparse
import csv
import functools
import hashlib
import importlib.util
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.trace import call_stack
from otel_gpu.trace.call_stack import _walk, build, event_order
from otel_gpu.trace.cli import MAX_OPERATOR_CHARS, _operator
from otel_gpu.trace.kernel_sequences import frequent_sequences, pool_ranks
from otel_gpu.trace.model import load_set
from tests.shared_data import needs_shared_data, shared_data
from kineto import training_trace

ROOT = Path(__file__).resolve().parents[2]
TRACES, REFS = shared_data("traces"), ROOT / "tests" / "data" / "hta_extra"
SETS = sorted(str(p.parent.relative_to(REFS)) for p in REFS.rglob("kernel_sequences_run_info.json"))
SHARED = [n for n in SETS if not n.startswith("built/")]
needs_traces = needs_shared_data("traces")
CLEAN = "tests/data/traces/cpu_gloo_clean"


@functools.lru_cache(maxsize=None)
def _set(path: str):
    return load_set(path)


@pytest.fixture(scope="module")
def skewed_dir(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("make_sets", REFS / "make_sets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.skewed(str(TRACES), str(tmp_path_factory.mktemp("skewed")))


def _calls(name: str):
    """HTA's calls on a set: (operator, min_pattern_len, rank, error) and its rows per call."""
    info = json.loads((REFS / name / "kernel_sequences_run_info.json").read_text())
    rows = defaultdict(list)
    with open(REFS / name / "kernel_sequences.csv") as fh:
        for r in csv.DictReader(fh):
            rows[(r["operator"], int(r["min_pattern_len"]), int(r["rank"]))].append(r)
    load_error = next((s["error"] for s in info["steps"] if s["step"] == "load"), None)
    calls = [(s["operator"], s["min_pattern_len"], s["rank"], s["error"]) for s in info["steps"] if "operator" in s]
    return calls, rows, load_error


def _check(ts, name):
    """Row for row where HTA answered; an answer (rows or a reason), not an exception, where it raised."""
    calls, want_rows, load_error = _calls(name)
    assert not load_error and calls
    stacks = {r: build(v) for r, v in ts.ranks.items()}
    matched = 0
    for op, n, rank, error in calls:
        got, why = frequent_sequences(ts.ranks[rank], stacks[rank], op, n)
        assert bool(got) != bool(why)
        if error:
            continue
        want = want_rows[(op, n, rank)]
        assert [(w["pattern_sha1"], int(w["kernels"]), int(w["count"]), int(w["gpu_kernel_duration_us"]),
                 int(w["cpu_op_duration_us"])) for w in want] == \
            [(hashlib.sha1(g["pattern"].encode()).hexdigest(), g["kernels"], g["count"],
              g["gpu_kernel_duration_us"], g["cpu_op_duration_us"]) for g in got], (op, n, rank)
        assert all(w["pattern"] in ("", g["pattern"]) for w, g in zip(want, got))
        matched += 1
    return matched


@needs_traces
@pytest.mark.parametrize("name", SHARED)
def test_parity_with_hta(name):
    _check(_set(str(TRACES / name)), name)


@needs_traces
def test_parity_on_the_8_rank_set(skewed_dir):
    assert _check(load_set(skewed_dir), "built/sampled_8rank_skewed") == 64


def test_references_cover_patterns():
    """The references are not all empty: non-trivial patterns on the 2-rank set, both ranks."""
    _, rows, _ = _calls("hta_sampled_2rank")
    assert len(rows[("autograd::engine", 3, 0)]) > 5 and len(rows[("autograd::engine", 1, 1)]) > 50
    assert {"hta_sampled_2rank", "hta_nccl_data", "hta_alexnet_single_rank"} <= set(SETS)


# --- HTA's event order and stack walk, against brute force -----------------------------------------

OPEN, CLOSE = -1, 1


def _hta_less(x, y) -> bool:
    """HTA 0.5.0's ``_less_than`` on (index, dur, kind, time) tuples, restated."""
    if x[3] != y[3]:
        return x[3] < y[3]
    if x[0] == y[0]:
        return x[2] == OPEN
    if x[1] == 0 or y[1] == 0:
        if x[1] == 0 and y[1] > 0:
            return y[2] == CLOSE
        if x[1] > 0 and y[1] == 0:
            return x[2] == OPEN
        if x[2] == y[2]:
            return x[0] < y[0] if x[2] == OPEN else x[0] > y[0]
        return x[2] == OPEN
    if x[2] != y[2]:
        return x[2] == CLOSE
    if x[1] != y[1]:
        return x[1] > y[1] if x[2] == OPEN else x[1] < y[1]
    return x[0] < y[0] if x[2] == OPEN else x[0] > y[0]


def _cyclic(points) -> bool:
    """A zero-duration event meeting both a start and an end of non-zero events at one time:
    HTA's comparison is not transitive there."""
    by_time = defaultdict(set)
    for idx, dur, kind, time in points:
        by_time[time].add("zero" if dur == 0 else kind)
    return any({"zero", OPEN, CLOSE} <= s for s in by_time.values())


events = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 8)), min_size=1, max_size=25)


@settings(max_examples=400, deadline=None)
@given(events)
def test_event_order_is_htas_order(evs):
    ts = np.array([e[0] for e in evs], np.int64)
    dur = np.array([e[1] for e in evs], np.int64)
    index = np.arange(len(evs)) * 3 + 5
    points = [(int(index[i]), int(dur[i]), OPEN, int(ts[i])) for i in range(len(evs))] + \
        [(int(index[i]), int(dur[i]), CLOSE, int(ts[i] + dur[i])) for i in range(len(evs))]
    ev, start = event_order(np.zeros(len(evs), np.int64), ts, dur, index)
    got = [(int(index[e]), int(dur[e]), OPEN if s else CLOSE, int(ts[e] + (0 if s else dur[e])))
           for e, s in zip(ev.tolist(), start.tolist())]
    assert sorted(got) == sorted(points)
    if _cyclic(points):
        assert all(a[3] <= b[3] for a, b in zip(got, got[1:]))
    else:
        assert all(_hta_less(a, b) for a, b in zip(got, got[1:])), got


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), max_size=40))
def test_walk_is_htas_stack(seq):
    seq = sorted(seq, key=lambda x: x[0])  # segments (threads) contiguous
    seg = np.array([s for s, _ in seq], np.int64)
    is_start = np.array([b for _, b in seq], bool)
    want = [-1] * len(seq)
    stack: list[int] = []
    for i, (s, b) in enumerate(seq):
        if i and seq[i - 1][0] != s:
            stack = []
        if b:
            want[i] = stack[-1] if stack else -1
            stack.append(i)
        elif stack:
            stack.pop()
    assert _walk(seg, is_start).tolist() == want


# --- the analysis on crafted traces and through the CLI ---------------------------------------------

@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    d = tmp_path_factory.mktemp("crafted")
    training_trace().write(str(d / "rank0.json"))
    return str(d)


def test_steps_give_one_pattern_each(crafted):
    v = load_set(crafted).ranks[0]  # 4 steps, the last one dropped (HTA's rule)
    rows, why = frequent_sequences(v, build(v), "ProfilerStep")
    assert why is None and [r["count"] for r in rows] == [1, 1, 1]
    assert all(r["pattern"].startswith("ProfilerStep#") and r["kernels"] == 26 for r in rows)
    rows, why = frequent_sequences(v, build(v), "aten::mm", min_pattern_len=1)
    assert rows[0]["count"] == 72 and rows[0]["pattern"] == "aten::mm|ampere_sgemm_128x64_nn"
    assert rows[0]["gpu_kernel_duration_us"] == 72 * 400
    assert frequent_sequences(v, build(v), "aten::mm")[1] and frequent_sequences(v, build(v), "nope")[1]


def test_pooled_over_ranks():
    rows = [{"rank": r, "operator": "x", "pattern": p, "kernels": 3, "count": c, "gpu_kernel_duration_us": 10,
             "cpu_op_duration_us": 20} for r, p, c in [(0, "a", 2), (1, "a", 1), (1, "b", 5)]]
    got = pool_ranks(rows)
    assert [(g["pattern"], g["count"], g["ranks"], g["gpu_kernel_duration_us"]) for g in got] == \
        [("b", 5, [1], 10), ("a", 3, [0, 1], 20)]


def test_cpu_only_trace_has_no_patterns():
    v = load_set(CLEAN).ranks[0]
    rows, why = frequent_sequences(v, build(v), "ProfilerStep")
    assert rows == [] and why


def test_cli_outputs(crafted, tmp_path, capsys):
    out, csv_dir = tmp_path / "o.json", tmp_path / "csv"
    assert main(["trace", "analyze", crafted, "--kernel-sequences", "ProfilerStep", "--kernel-sequences", "nope",
                 "--top-k", "2", "--json", str(out), "--csv", str(csv_dir)]) == 0
    text = capsys.readouterr().out
    assert "Frequent kernel sequences under 'ProfilerStep' (top 2 of 3 patterns" in text
    assert "under 'nope': none" in text
    doc = json.loads(out.read_text())
    assert len(doc["kernel_sequences"]) == 3 and doc["kernel_sequences_request"]["min_pattern_len"] == 3
    assert any("'nope'" in n for n in doc["notes"])
    rows = list(csv.DictReader(open(csv_dir / "kernel_sequences.csv")))
    assert len(rows) == 3 and rows[0]["rank"] == "0" and rows[0]["operator"] == "ProfilerStep"


def test_absent_unless_asked(crafted, tmp_path, capsys):
    out, csv_dir = tmp_path / "o.json", tmp_path / "csv"
    assert main(["trace", "analyze", crafted, "--json", str(out), "--csv", str(csv_dir)]) == 0
    assert "kernel sequences" not in capsys.readouterr().out
    assert "kernel_sequences" not in json.loads(out.read_text())
    assert not (csv_dir / "kernel_sequences.csv").exists()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_operator_flag_accepts_or_refuses_in_one_line(text):
    try:
        got = _operator(text)
    except argparse.ArgumentTypeError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 300
        assert not text or "\n" in text or len(text) > MAX_OPERATOR_CHARS
        return
    assert got == text and got and "\n" not in got


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["--min-pattern-len", "--top-k"]),
       st.one_of(st.integers(-5, 0).map(str), st.integers(10 ** 6 + 1, 10 ** 9).map(str),
                 st.text(alphabet="x.e-", min_size=1, max_size=4)))
def test_bad_counts_exit_2(flag, value):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["trace", "analyze", CLEAN, "--quiet", "--kernel-sequences", "x", flag, value])
    assert code == 2 and flag in err.getvalue() and err.getvalue().count("\n") == 1


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 50), st.integers(1, 50))
def test_counts_change_only_what_they_should(crafted, n, k):
    v = _set(crafted).ranks[0]
    rows, why = frequent_sequences(v, build(v), "ProfilerStep", n)
    assert (rows and all(r["kernels"] >= n for r in rows)) or (not rows and n > 26 and why)


def test_flags_need_kernel_sequences(capsys):
    assert main(["trace", "analyze", CLEAN, "--quiet", "--top-k", "3"]) == 2
    err = capsys.readouterr().err
    assert "--kernel-sequences" in err and err.count("\n") == 1
    assert main(["trace", "analyze", CLEAN, "--quiet", "--kernel-sequences", ""]) == 2
    assert "--kernel-sequences" in capsys.readouterr().err


def test_module_has_no_pandas():
    src = Path(call_stack.__file__).read_text() + (Path(call_stack.__file__).parent / "kernel_sequences.py").read_text()
    assert "import pandas" not in src and "import networkx" not in src
