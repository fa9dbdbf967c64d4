"""Property tests of the capture's parsers at the edge: the A-B steps (flag `run --trace-steps`, variable
OTELGPU_TRACE_STEPS), `trace capture`'s flags, the request file the ranks read, the rank status file
and the choice of the first captured step. Whatever the text, a value within its bounds, or one line
and exit 2 (None for a file); never another exception."""
from __future__ import annotations

import contextlib
import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.errors import ConfigError
from otel_gpu.settings_check import check_rank_settings
from otel_gpu.trace import capture_files as cf
from otel_gpu.trace.capture_cli import MIN_MARGIN, MIN_STEP_S, choose_start
from otel_gpu.training.trace_capture import _stacks
from otel_gpu.values import SWITCH_OFF, SWITCH_ON

FAST = settings(max_examples=200, deadline=None)
STEPISH = st.one_of(
    st.text(max_size=14),
    st.builds(lambda a, sep, b: f"{a}{sep}{b}", st.integers(-5, 10**11).map(str), st.sampled_from(["-", " - ", "--", ",", ":", ""]),
              st.one_of(st.integers(-5, 10**11).map(str), st.just(""))),
    st.sampled_from(["5-6", "5", " 5-6 ", "0-1", "6-5", "1-500", "1-501", "٣-٤", "5-6-7", "a-b", "1e3", "+5", "-5",
                     "1000000000", "1000000001", "5-", "-6"]))


def _expected(raw: str):
    """What parse_steps should give: (a, b), or None for a refusal (a model written independently)."""
    parts = raw.strip().split("-")
    if len(parts) == 1:
        parts = parts * 2
    parts = [p.strip(" \t") for p in parts]
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 10 for p in parts):
        return None
    a, b = (int(p) for p in parts)
    if not (1 <= a <= b <= cf.MAX_STEP) or b - a + 1 > cf.MAX_SPAN:
        return None
    return a, b


@FAST
@given(STEPISH)
def test_steps_parse_to_a_bounded_window_or_one_line(raw):
    try:
        got = cf.parse_steps(raw, "X")
    except ConfigError as exc:
        assert str(exc).startswith("X=") and "\n" not in str(exc)
        assert _expected(raw) is None, raw
        return
    assert got == _expected(raw), raw
    a, b = got
    assert 1 <= a <= b <= cf.MAX_STEP and b - a < cf.MAX_SPAN


@FAST
@given(STEPISH)
def test_the_variable_is_checked_as_the_flag_is(raw):
    try:
        check_rank_settings({cf.TRACE_STEPS: raw})
    except ConfigError as exc:
        assert str(exc).startswith(f"{cf.TRACE_STEPS}=") and "\n" not in str(exc)
        assert _expected(raw) is None
    else:
        assert not raw.strip() or _expected(raw) is not None


def _exit(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    return status, err.getvalue()


def _refused_before_run(tmp_path_factory, flag: str, raw: str) -> None:
    """`run FLAG=raw -- touch MARKER`: exit 2, one line naming the flag, the command never started."""
    marker = tmp_path_factory.mktemp("never") / "ran"
    status, err = _exit(["run", "--no-record", f"{flag}={raw}", "--", "touch", str(marker)])
    assert status == 2 and len(err.strip().splitlines()) == 1 and flag in err
    assert not marker.exists()


@settings(max_examples=60, deadline=None)
@given(raw=STEPISH.filter(lambda s: _expected(s) is None and not s.startswith("-")))
def test_a_bad_trace_steps_flag_is_one_line_and_exit_2_before_anything_runs(tmp_path_factory, raw):
    _refused_before_run(tmp_path_factory, "--trace-steps", raw)


SWITCHISH = st.one_of(st.text(max_size=8), st.sampled_from(["1", "0", " on ", "OFF", "Yes", "no", "true", "2", "of", "",
                                                              "１", "0\n", "-1"]))


def _switch(raw: str):
    """What a switch should read as: True, False, or None for a refusal (a model written independently)."""
    text = raw.strip().lower()
    return True if text in SWITCH_ON else False if text in SWITCH_OFF else None


@FAST
@given(SWITCHISH)
def test_trace_stacks_is_checked_before_the_run_and_means_off_when_bad_in_a_rank(raw):
    try:
        check_rank_settings({cf.TRACE_STACKS: raw})
    except ConfigError as exc:
        assert str(exc).startswith(f"{cf.TRACE_STACKS}=") and "\n" not in str(exc) and _switch(raw) is None
    else:
        assert not raw.strip() or _switch(raw) is not None
    want = cf.DEFAULT_STACKS if not raw.strip() else bool(_switch(raw))   # a bad value in a rank: stacks off
    assert _stacks({cf.TRACE_STACKS: raw}) is want


@settings(max_examples=40, deadline=None)
@given(raw=SWITCHISH.filter(lambda s: _switch(s) is None and not s.startswith("-")))
def test_a_bad_trace_stacks_flag_is_one_line_and_exit_2_before_anything_runs(tmp_path_factory, raw):
    _refused_before_run(tmp_path_factory, "--trace-stacks", raw)


def test_the_trace_stacks_flag_wins_over_the_variable_and_ranks_get_faulthandler(monkeypatch, capfd):
    monkeypatch.setenv(cf.TRACE_STACKS, "1")
    monkeypatch.delenv("PYTHONFAULTHANDLER", raising=False)
    cmd = ["sh", "-c", f'echo "${cf.TRACE_STACKS} $PYTHONFAULTHANDLER"']
    assert main(["run", "--no-record", "--no-profile", "--trace-stacks", "off", "--"] + cmd) == 0
    assert capfd.readouterr().out.split() == ["0", "1"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["--steps", "--timeout", "--margin"]),
       st.one_of(st.text(max_size=8), st.sampled_from(["0", "-1", "501", "nan", "inf", "1e9", "1.5", "3"])))
def test_capture_flags_are_bounded_or_one_line(flag, raw):
    argv = ["trace", "capture", "/nonexistent-run", f"{flag}={raw}"] + ([] if flag == "--steps" else ["--steps", "1"])
    status, err = _exit(argv)
    assert status == 2 and len(err.strip().splitlines()) == 1   # a good value gets as far as the missing folder
    if "no ranks registered" in err:
        if flag == "--steps":
            assert 1 <= int(raw) <= cf.MAX_SPAN
        else:
            assert 0 < float(raw) < 1e6


@FAST
@given(st.one_of(st.binary(max_size=200),
                 st.builds(lambda d: json.dumps(d).encode(),
                           st.dictionaries(st.sampled_from(["id", "kind", "start", "end", "x"]),
                                           st.one_of(st.integers(-3, 10**10), st.text(max_size=5), st.booleans(),
                                                     st.none(), st.sampled_from(["poll", "capture", "ab12"])),
                                           max_size=5))))
def test_a_request_is_valid_or_none(raw):
    req = cf.parse_request(raw)
    if req is None:
        return
    assert req["kind"] in ("poll", "capture") and req["id"] and len(req["id"]) <= 32
    if req["kind"] == "capture":
        assert 1 <= req["start"] <= req["end"] <= cf.MAX_STEP and req["end"] - req["start"] < cf.MAX_SPAN


@FAST
@given(st.binary(max_size=300))
def test_a_status_is_typed_or_none(raw):
    doc = cf.parse_status(raw)
    assert doc is None or (isinstance(doc["rank"], str) and isinstance(doc["step"], int))


ANSWER = st.fixed_dictionaries({"step": st.integers(1, 10**6), "time": st.floats(0, 2e9),
                                "step_s": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))})


@FAST
@given(st.lists(ANSWER, min_size=1, max_size=8), st.floats(0, 2e9), st.floats(0.01, 3600))
def test_the_first_step_is_past_every_rank_by_the_margin(answers, now, margin_s):
    start = choose_start(answers, now, margin_s)
    assert start <= cf.MAX_STEP
    for a in answers:
        assert start >= min(a["step"] + MIN_MARGIN + 1, cf.MAX_STEP)
        s = a["step_s"]
        if s is not None and 0 < s < float("inf") and now >= a["time"] and start < cf.MAX_STEP:
            # where the rank is projected to be now, plus the margin, is still before the start
            ahead = (now - a["time"] + cf.CHECK_PERIOD_S + margin_s) / max(s, MIN_STEP_S)
            assert start > a["step"] + min(ahead, cf.MAX_STEP) or start == cf.MAX_STEP
