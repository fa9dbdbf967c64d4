"""Flags and output paths of `otel-gpu trace`: bad values exit 2 with one line, before any work,
and no output file is left half-written."""
import argparse
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.trace.cli import MAX_RANK, _micros, _ranks

CLEAN = "tests/data/traces/cpu_gloo_clean"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 40)), min_size=1, max_size=6))
def test_rank_list_round_trip(parts):
    text = ",".join(f"{lo}-{lo + w}" if w else str(lo) for lo, w in parts)
    want = sorted({r for lo, w in parts for r in range(lo, lo + w + 1)})
    assert _ranks(text) == want


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_rank_text_parses_or_is_refused(text):
    try:
        got = _ranks(text)
    except argparse.ArgumentTypeError as exc:
        assert "bad rank list" in str(exc) and "\n" not in str(exc) and len(str(exc)) < 500
        return
    assert got and all(0 <= r <= MAX_RANK for r in got) and got == sorted(set(got))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=10)))
def test_time_flags_finite_or_refused(text):
    try:
        x = _micros(text)
    except argparse.ArgumentTypeError:
        return
    assert 0 <= x < 1e15


def test_huge_rank_range_refused_quickly(capsys):
    assert main(["trace", "analyze", CLEAN, "--ranks", "0-10000000"]) == 2
    err = capsys.readouterr().err
    assert "bad rank list '0-10000000'" in err and err.count("\n") == 1


def test_many_missing_ranks_one_short_line(capsys):
    assert main(["trace", "analyze", CLEAN, "--ranks", "0-100000", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and len(err) < 300 and "(99,999 ranks)" in err


@pytest.mark.parametrize("flags, message", [
    (["--kernel-delay", "nan"], "--kernel-delay"),
    (["--runtime-cutoff", "inf"], "--runtime-cutoff"),
    (["--launch-delay-cutoff", "-1"], "--launch-delay-cutoff"),
    (["--top", "0"], "--top"),
    (["--jobs", "0"], "--jobs"),
    (["--num-kernels", "x"], "--num-kernels"),
    (["--duration-ratio", "nan"], "--duration-ratio"),
])
def test_bad_flag_values_exit_2(capsys, flags, message):
    assert main(["trace", "analyze", CLEAN, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def _outputs(tmp_path):
    (tmp_path / "a_file").write_text("keep me")
    (tmp_path / "a_dir").mkdir()
    return [
        (["--json", str(tmp_path / "a_dir")], "is a folder"),
        (["--csv", str(tmp_path / "a_file")], "exists and is not a folder"),
        (["--json", str(tmp_path / "missing" / "o.json")], "does not exist"),
        (["--csv", str(tmp_path / "missing" / "c")], "does not exist"),
    ]


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("command", ["analyze", "diff"])
def test_unwritable_outputs_exit_2_before_work(tmp_path, capsys, case, command):
    flags, message = _outputs(tmp_path)[case]
    dirs = [CLEAN] if command == "analyze" else [CLEAN, CLEAN]
    before = sorted(os.listdir(tmp_path))
    assert main(["trace", command, *dirs, "--quiet", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and flags[0] in err and len(err.splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "a_file").read_text() == "keep me"


def test_existing_json_file_is_replaced_whole(tmp_path):
    out = tmp_path / "o.json"
    out.write_text("old")
    assert main(["trace", "analyze", CLEAN, "--quiet", "--json", str(out)]) == 0
    assert out.read_text().startswith("{") and not [f for f in os.listdir(tmp_path) if f.startswith(".")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.integers(-5, 2_000_000).map(str), st.text(max_size=12)))
def test_critical_path_step_flag_parses_or_exits_2(capsys, text):
    from otel_gpu.trace.cli import _index

    try:
        n = _index(text)
    except argparse.ArgumentTypeError as exc:
        assert "\n" not in str(exc)
        assert main(["trace", "analyze", CLEAN, "--quiet", "--critical-path-step", text]) == 2
        err = capsys.readouterr().err.strip()
        assert "--critical-path-step" in err and len(err.splitlines()) == 1
        return
    assert 0 <= n <= 1_000_000


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=250))
def test_critical_path_annotation_flag(text):
    from otel_gpu.trace.cli import _annotation

    try:
        got = _annotation(text)
    except argparse.ArgumentTypeError as exc:
        assert (len(text) > 200 or not text.isprintable()) and "\n" not in str(exc)
        return
    assert got == text


def test_critical_path_flags_reach_the_result(tmp_path):
    out = tmp_path / "r.json"
    trace_dir = "tests/data/hta_extra/crafted/sync_2stream"
    assert main(["trace", "analyze", trace_dir, "--quiet", "--json", str(out), "--critical-path-step", "0"]) == 0
    import json
    paths = json.loads(out.read_text())["critical_path"]
    assert [p["instance"] for p in paths] == [0, 0]
    assert main(["trace", "analyze", trace_dir, "--quiet", "--json", str(out), "--critical-path-step", "9"]) == 0
    assert all("instance 9" in p["error"] for p in json.loads(out.read_text())["critical_path"])
    assert main(["trace", "analyze", trace_dir, "--quiet", "--json", str(out), "--no-critical-path"]) == 0
    assert json.loads(out.read_text())["critical_path"] == []
