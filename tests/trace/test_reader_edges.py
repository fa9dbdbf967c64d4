"""The reader on hostile input: every valid JSON trace is read whatever its string lengths, what is
not a trace is refused, and impossible numbers never reach a figure (dropped or cleared, counted
in a note). Property-based where the input space is large."""
import copy
import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.trace.analyze import analyze
from otel_gpu.trace.model import load_set
from otel_gpu.trace import decoders, intake
from otel_gpu.trace.parse import CHUNK_CHARS, TIME_LIMIT_US, TraceFormatError, read_trace

EDGE = Path("tests/data/traces/edge")
REAL_GZ = "tests/data/traces/cpu_gloo_sync_straggler/rank1.pt.trace.json.gz"


def one_rank(tmp_path, name):
    d = tmp_path / "run"
    d.mkdir(exist_ok=True)
    shutil.copy(EDGE / name, d / name)
    return d


@pytest.mark.parametrize("name, message", [
    ("not_a_trace_array.json", "not an object: 3"),
    ("empty_events.json", "'traceEvents' is empty"),
    ("no_duration_events.json", "no duration event (with ts, dur and cat) among the 1 element of"),
    ("string_ts_only.json", "ts missing or not a number: 1"),
])
def test_non_traces_refused_with_exit_2(tmp_path, capsys, name, message):
    d = one_rank(tmp_path, name)
    assert main(["trace", "analyze", str(d), "--json", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and name in err and "not a PyTorch profiler trace" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("name, kept, note", [
    ("stream_2pow70.json", 3, "1 event kept with a field cleared (stream/correlation/external id beyond int64"),
    ("ts_10pow400.json", 2, "1 event not analysed (ts not finite or beyond 2^53 us: 1)"),
    ("negative_and_infinite_dur.json", 2, "2 events not analysed (negative dur: 1, dur not finite"),
    ("string_ts_mixed.json", 2, "2 events not analysed (ts missing or not a number: 1, dur not a number: 1)"),
])
def test_bad_events_dropped_and_named(tmp_path, name, kept, note):
    d = one_rank(tmp_path, name)
    ev = read_trace(str(d / name))
    assert len(ev) == kept
    assert (ev.dur >= 0).all() and (ev.ts >= 0).all()
    doc = analyze(load_set(str(d)))
    assert any(note in n for n in doc["notes"]), doc["notes"]
    for t in doc["temporal_breakdown"]:  # figures stay possible
        assert 0 <= t["idle_time_pctg"] <= 100 and 0 <= t["compute_time_pctg"] <= 100


def test_negative_duration_gives_no_impossible_figure(tmp_path):
    d = one_rank(tmp_path, "negative_and_infinite_dur.json")
    t = analyze(load_set(str(d)))["temporal_breakdown"][0]
    # only the kernel at 100 us for 10 us is left: the ones with dur -50 and 1e400 are not analysed
    assert (t["kernel_time_us"], t["compute_time_us"], t["idle_time_us"]) == (10, 10, 0)


def test_long_string_across_the_chunk_boundary(tmp_path):
    """A 2 MB string (a Python stack) that starts before and ends after the first read."""
    n = CHUNK_CHARS // 100   # filler events of ~70 characters: the string starts inside the first read
    filler = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "ts": i, "dur": 1} for i in range(n)]
    events = filler + [{"ph": "X", "cat": "cpu_op", "name": "long", "ts": n + 10, "dur": 3,
                        "args": {"stack": "x" * (2 << 20)}},
                       {"ph": "X", "cat": "cpu_op", "name": "after", "ts": n + 20, "dur": 1}]
    text = json.dumps({"traceEvents": events})
    start = text.index('"xxxx')
    assert start < CHUNK_CHARS < start + (2 << 20)  # the string really crosses the first read
    p = tmp_path / "r.json"
    p.write_text(text)
    ev = read_trace(str(p))
    assert len(ev) == n + 2 and ev.names[ev.name[-1]] == "after"


def test_integer_of_thousands_of_digits(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}, '
                 '{"ph": "X", "cat": "cpu_op", "name": "b", "ts": 1' + "0" * 5000 + ', "dur": 2}]}')
    ev = read_trace(str(p))
    assert len(ev) == 1 and ev.dropped == {"ts not finite or beyond 2^53 us": 1}


def test_implausible_rank_refused(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('{"distributedInfo": {"rank": 99999999999}, "traceEvents": '
                 '[{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}]}')
    with pytest.raises(TraceFormatError, match="not a plausible rank"):
        read_trace(str(p))


# ---- property-based: any mix of field types ----

_any_number = st.one_of(
    st.integers(min_value=-(2 ** 80), max_value=2 ** 80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=0, max_value=10 ** 7),
)
_any_value = st.one_of(_any_number, st.none(), st.booleans(), st.text(max_size=5),
                       st.lists(st.integers(), max_size=2))
_event = st.fixed_dictionaries(
    {"ph": st.just("X")},
    optional={"ts": _any_value, "dur": _any_value, "tid": _any_value, "pid": _any_value,
              "cat": st.one_of(st.sampled_from(["kernel", "cpu_op", "Trace", "gpu_user_annotation", "cuda_sync"]),
                               _any_value),
              "name": _any_value,
              "args": st.one_of(_any_value, st.fixed_dictionaries({}, optional={
                  "stream": _any_value, "correlation": _any_value, "External id": _any_value,
                  "wait_on_stream": _any_value, "wait_on_cuda_event_record_corr_id": _any_value}))})
_element = st.one_of(_event, _event, _event, _any_value)


def _kept_by_oracle(e) -> bool:
    """What the reader must keep: a duration event whose ts and dur are finite numbers in range."""
    if not isinstance(e, dict) or e.get("dur") is None or e.get("cat") is None or e.get("cat") == "Trace":
        return False
    ts, dur = e.get("ts"), e.get("dur")
    number = lambda x: type(x) in (int, float) and not math.isnan(x)  # noqa: E731
    return number(ts) and number(dur) and abs(ts) <= TIME_LIMIT_US and 0 <= dur <= TIME_LIMIT_US


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_element, max_size=30), st.integers(min_value=5, max_value=400))
def test_any_event_mix_is_read_or_refused_cleanly(tmp_path, elements, chunk):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"traceEvents": elements}))  # NaN/Infinity literals are valid to Python's json
    want = sum(map(_kept_by_oracle, elements))
    try:
        ev = read_trace(str(p), chunk_chars=chunk)
    except TraceFormatError as exc:
        assert want == 0, exc
        return
    assert len(ev) == want
    assert len(ev.thread) == want and all(0 <= c < len(ev.threads) for c in ev.thread.tolist())
    assert all(type(x) in (int, str) for pair in ev.threads for x in pair)
    assert sum(ev.dropped.values()) + want <= len(elements)
    assert ((ev.dur >= -1) & (ev.dur <= TIME_LIMIT_US)).all()  # -1: HTA's rounding of sub-us events
    assert (ev.stream >= -(2 ** 63)).all()  # ids fit int64 (clamped ones are -1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 1000), st.text(max_size=300)), min_size=1,
                max_size=40),
       st.integers(min_value=3, max_value=2000))
def test_chunk_size_never_changes_the_result(tmp_path, rows, chunk):
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "ts": ts, "dur": d, "args": {"s": n * 3}}
              for ts, d, n in rows]
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"traceEvents": events}, ensure_ascii=False))
    a, b = read_trace(str(p)), read_trace(str(p), chunk_chars=chunk)
    assert a.ts.tolist() == b.ts.tolist() and a.dur.tolist() == b.dur.tolist()
    assert [a.names[i] for i in a.name] == [b.names[i] for i in b.name] == [r[2] for r in rows]


_needs_msgspec = pytest.mark.skipif(decoders._decode_structs is None,
                                    reason="msgspec not installed (extra 'trace') or turned off by OTELGPU_TRACE_JSON")


def _fields(ev):
    return ([getattr(ev, f).tolist() for f in ("index", "ts", "dur", "stream", "correlation", "external_id",
                                              "bw_index", "bw_value")], [ev.names[i] for i in ev.name],
            [ev.names[i] for i in ev.cat], ev.dropped, ev.clamped, ev.ts_rounded, ev.annotation_tid,
            [ev.threads[c] for c in ev.thread], ev.sync_args)


@_needs_msgspec
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_element, max_size=30))
def test_msgspec_and_dict_decoding_agree(tmp_path, monkeypatch, elements):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"traceEvents": elements}))

    def read():
        try:
            return _fields(read_trace(str(p)))
        except TraceFormatError as exc:
            return str(exc)
    fast = read()
    with monkeypatch.context() as m:
        m.setattr(decoders, "_decode_structs", None)
        assert read() == fast


@_needs_msgspec
@pytest.mark.parametrize("path", [REAL_GZ, "tests/data/traces/edge/stream_2pow70.json",
                                  "tests/data/traces/edge/negative_and_infinite_dur.json"])
def test_msgspec_and_dict_decoding_agree_on_files(monkeypatch, path):
    fast = _fields(read_trace(path))
    monkeypatch.setattr(decoders, "_decode_structs", None)
    assert _fields(read_trace(path)) == fast


def test_number_cut_by_a_read_is_read_whole(tmp_path):
    """"0.25" cut after "0." by a read used to decode as 0 and then fail on the '.'."""
    p = tmp_path / "r.json"
    p.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}, "", 0.25, '
                 '{"ph": "X", "cat": "cpu_op", "name": "b", "ts": 3.5, "dur": 1.25e1}]}')
    for chunk in range(3, 60):
        ev = read_trace(str(p), chunk_chars=chunk)
        assert len(ev) == 2 and ev.dropped == {"traceEvents element that is not an object": 2}, chunk
        assert ev.dur.tolist() == [2.0, 12.0]  # 3.5 + 12.5 = 16 -> ceil(3.5) = 4, floor(16) - 4 = 12


def test_thread_and_sync_arguments_kept_per_event(tmp_path):
    p = tmp_path / "r.json"
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 10, "tid": -5, "ts": 1, "dur": 2},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 2, "dur": 1,
               "args": {"stream": 7, "correlation": 3}},
              {"ph": "X", "cat": "cuda_sync", "name": "Event Sync", "pid": 0, "tid": 7, "ts": 4, "dur": 1,
               "args": {"stream": -1, "correlation": 9, "wait_on_stream": 7,
                        "wait_on_cuda_event_record_corr_id": 3}}]
    p.write_text(json.dumps({"traceEvents": events}))
    ev = read_trace(str(p))
    assert [ev.threads[c] for c in ev.thread] == [(10, -5), (0, "stream 7"), (0, 7)]
    assert ev.sync_args == {2: (7, 3)}


# ---- the vectorized intake of well-typed batches against the event-by-event one ----

_typed_number = st.one_of(st.integers(-(2 ** 60), 2 ** 60), st.floats(-1e17, 1e17, allow_nan=False),
                          st.integers(0, 10 ** 6), st.floats(0, 1e4))
_typed_id = st.one_of(st.integers(-3, 10), st.integers(-(2 ** 63), 2 ** 64))   # beyond int64: per event
_typed_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "s", "f", "M"])},
    optional={"ts": _typed_number, "dur": _typed_number,
              "cat": st.sampled_from(["kernel", "cpu_op", "Trace", "gpu_user_annotation", "cuda_sync", "ac2g"]),
              "name": st.sampled_from(["a", "b", "aten::mm", "é"]),
              "pid": st.one_of(st.integers(-(2 ** 33), 2 ** 33), st.sampled_from(["Spans", "0"])),
              "tid": st.one_of(st.integers(-3, 10), st.sampled_from(["stream 7", "PyTorch Profiler"])),
              "args": st.fixed_dictionaries({}, optional={
                  "stream": _typed_id, "correlation": _typed_id, "External id": _typed_id,
                  "external id": _typed_id, "memory bandwidth (GB/s)": st.floats(-1, 1e3, allow_nan=False),
                  "wait_on_stream": st.integers(-1, 9), "wait_on_cuda_event_record_corr_id": st.integers(-1, 9)})})


def _collected(col):
    return ([getattr(col, f).tolist() for f in ("index", "ts", "dur", "name", "cat", "stream", "corr", "ext", "bw",
                                               "thread")],
            col.sym, col.flags, col.count, col.dropped, col.clamped, col.annotation_tid, col.threads, col.sync_args)


@_needs_msgspec
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_typed_event, max_size=12), min_size=1, max_size=3))
@example([[{"ph": "X", "cat": "kernel", "ts": 0, "tid": 0, "pid": 1, "name": "a", "args": {}, "dur": 0},
           {"ph": "X", "dur": 0, "ts": 0, "tid": 0, "cat": "kernel", "pid": 0}]])   # threads coded as first seen
def test_typed_batches_agree_with_event_by_event_intake(batches):
    """Batches the typed decoder accepts: the vectorized intake keeps what ``add_struct`` keeps, with the
    same ids, threads and flags, or declines the batch having changed nothing."""
    fast, slow = intake.Collector(), intake.Collector()
    for batch in batches:
        text = json.dumps(batch)
        try:
            typed = decoders._decode_typed(text)
        except Exception as exc:   # msgspec.DecodeError: a value of another type (not generated here)
            raise AssertionError(text) from exc
        before = copy.deepcopy(_collected(fast))
        if not fast.add_typed(typed, decoders.NO_ARGS):
            assert _collected(fast) == before
            for e in decoders._decode_structs(text):
                fast.add_struct(e)
        for e in decoders._decode_structs(text):
            slow.add_struct(e)
    assert _collected(fast) == _collected(slow)


_nested = st.recursive(st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.text("a}{,[]\"", max_size=3)),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(st.sampled_from(["x", "y", "stream"]), inner,
                                                               max_size=3)), max_leaves=8)


@_needs_msgspec
@settings(max_examples=150, deadline=None)
@given(st.lists(st.fixed_dictionaries({"ph": st.just("X"), "ts": st.integers(0, 99), "args": _nested}), min_size=1,
                max_size=4))
def test_a_piece_given_up_early_is_one_no_decoder_takes(events):
    """A batch cut at any "}," (inside an event's nested value too) is given up on at the typed decoder's
    error only when every decoder, the standard library's with its NaN literals included, refuses it."""
    text = json.dumps(events)[1:-1]
    cuts = [i for i in range(len(text)) if text.startswith("},", i)] + [len(text) - 1]
    for cut in cuts:
        piece = "[" + text[:cut + 1] + "]"
        try:
            decoders._decode_typed(piece)
        except Exception as exc:
            if decoders._ends_inside_a_value(piece, exc):
                with pytest.raises(ValueError):
                    json.loads(piece)


def test_a_batch_cut_inside_an_event_is_given_up_early():
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2, "args": {"x": {"y": 1}, "z": 2}}]
    text = json.dumps(events)
    piece = "[" + text[1:text.index("},") + 1] + "]"
    with pytest.raises(Exception) as exc:
        decoders._decode_typed(piece)
    assert decoders._ends_inside_a_value(piece, exc.value)
    assert not decoders.decode_piece(piece, intake.Collector())
    assert decoders.decode_piece(text, intake.Collector())
