"""Flight Recorder dumps -> GPU-timed collectives: parsing of every format we read (JSON and pickle,
real gloo dumps, synthetic NCCL ones), the cursor that counts each collective once across polls,
and the poller that feeds the sink."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.training import flight_recorder as fr
from otel_gpu.training import gpu_collectives as gc
from tests.childenv import clean_env
from tests.servers import free_port

from fr_synth import Job, dump, simulate


def entry(i: int, seq: int | None = None, kind: str = "nccl:all_reduce", dur: float | None = 1.5,
          state: str = "completed", retired: bool | None = True, created: int = 10, pg=("0", "default_pg")) -> dict:
    e = {"record_id": i, "pg_id": 0, "process_group": list(pg), "collective_seq_id": seq if seq is not None else i + 1,
         "p2p_seq_id": 0, "op_id": i + 1, "profiling_name": kind, "time_created_ns": created, "state": state,
         "is_p2p": False, "input_sizes": [[4]], "output_sizes": [[4]]}
    if dur is not None:
        e["duration_ms"] = dur
    if retired is not None:
        e["retired"] = retired
    return e


# ---- parsing ---------------------------------------------------------------------------------

def test_json_and_pickle_of_a_synthetic_nccl_dump_agree():
    res = simulate(Job(ranks=2, steps=3))
    text = dump(res.entries[0])
    doc = json.loads(text)
    for e in doc["entries"]:
        e["process_group"] = tuple(e["process_group"])   # the pickle dump's form
    v1, a = fr.parse(text)
    v2, b = fr.parse(pickle.dumps(doc))
    assert v1 == v2 == "2.10" and a == b and len(a) == 9
    assert [r.kind for r in a[:3]] == ["all_gather", "all_gather", "reduce_scatter"]
    assert all(r.duration_s and r.final and r.group == "default_pg" for r in a)


@pytest.mark.parametrize("name, kind", [("nccl:_all_gather_base", "all_gather"), ("nccl:_reduce_scatter_base", "reduce_scatter"),
                                        ("nccl:all_gather_into_tensor_coalesced", "all_gather"), ("gloo:all_reduce", "all_reduce"),
                                        ("nccl:ALLTOALL_BASE", "ALLTOALL_BASE"), ("nccl:alltoall_base", "all_to_all"), ("", "unknown")])
def test_kinds(name, kind):
    assert fr.kind_of(name) == kind


@pytest.mark.parametrize("data, says", [
    (b"not json", "invalid JSON"), ("[1, 2]", "Expected `object`"), ('{"entries": 3}', "entries"),
    ('{"entries": [{"record_id": "x"}]}', "record_id"), ('{"entries": [{"record_id": 1, "duration_ms": "1"}]}', "duration_ms"),
    pytest.param('{"entries": [{"record_id": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}]}", "nested too deep",
                 id="nested-100000-deep"),
    (pickle.dumps({"entries": [object]}), "builtins.object"), (b"\x80\x04garbage", "unreadable pickle"),
])
def test_a_malformed_dump_is_one_clear_error(data, says):
    with pytest.raises(fr.FlightRecorderError, match="not a Flight Recorder dump") as e:
        fr.parse(data)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_old_formats_without_retired_or_process_group():
    old = {"version": "2.1", "entries": [{"record_id": 0, "pg_id": 3, "collective_seq_id": 1, "profiling_name": "nccl:broadcast",
                                          "state": "completed", "duration_ms": 2.0, "time_created_ns": 5}]}
    _, (r,) = fr.parse(pickle.dumps(old))
    assert (r.pg, r.group, r.retired, r.final, r.kind, r.duration_s) == ("3", "3", None, True, "broadcast", 0.002)


def test_missing_and_null_durations():
    _, recs = fr.parse(json.dumps({"entries": [entry(0, dur=None), {**entry(1), "duration_ms": None}]}))
    assert [r.duration_s for r in recs] == [None, None]


ENTRY = st.fixed_dictionaries({
    "record_id": st.integers(0, 1 << 40), "pg_id": st.integers(0, 100),
    "process_group": st.tuples(st.text(max_size=5), st.text(max_size=8)),
    "collective_seq_id": st.integers(0, 1 << 40), "p2p_seq_id": st.integers(0, 1 << 20),
    "profiling_name": st.sampled_from(["nccl:all_reduce", "nccl:_all_gather_base", "gloo:broadcast", "nccl:coalesced", "x"]),
    "state": st.sampled_from(["scheduled", "started", "completed"]), "retired": st.booleans(),
    "time_created_ns": st.integers(0, 1 << 62), "is_p2p": st.booleans(),
}, optional={"duration_ms": st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False)), "frames": st.just([])})


@settings(max_examples=150, deadline=None)
@given(st.lists(ENTRY, max_size=20), st.sampled_from(["2.1", "2.4", "2.9", "2.10"]))
def test_property_json_and_pickle_decode_to_the_same_records(entries, version):
    doc = {"version": version, "pg_config": {}, "entries": entries}
    as_json = json.dumps({**doc, "entries": [{**e, "process_group": list(e["process_group"])} for e in entries]})
    assert fr.parse(as_json) == fr.parse(pickle.dumps(doc)) == fr.parse(doc)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200),
                 st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=4), st.floats()),
                              lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=12), c, max_size=4)),
                              max_leaves=12).map(lambda x: json.dumps({"entries": [x]}))))
def test_property_any_input_parses_or_says_why(data):
    try:
        fr.parse(data)
    except fr.FlightRecorderError as exc:
        assert str(exc).startswith("not a Flight Recorder dump")


# ---- the cursor ------------------------------------------------------------------------------

def test_each_collective_counted_once_across_polls_and_in_flight_ones_later():
    cur = fr.Cursor()
    first = cur.update(fr.parse(json.dumps({"entries": [entry(0), entry(1, state="started", retired=False, dur=None), entry(2)]}))[1])
    assert [r.record_id for r in first.timed] == [0, 2] and first.unmeasured == {}
    second = cur.update(fr.parse(json.dumps({"entries": [entry(0), entry(1), entry(2), entry(3)]}))[1])
    assert [r.record_id for r in second.timed] == [1, 3]
    assert cur.update(fr.parse(json.dumps({"entries": [entry(2), entry(3)]}))[1]).timed == []


def test_ring_overflow_between_polls_is_counted_exactly():
    cur = fr.Cursor()
    cur.update(fr.parse(json.dumps({"entries": [entry(i) for i in range(4)]}))[1])
    got = cur.update(fr.parse(json.dumps({"entries": [entry(i) for i in range(10, 14)]}))[1])
    assert got.unmeasured == {fr.OVERFLOW: 6} and [r.record_id for r in got.timed] == [10, 11, 12, 13]


def test_a_record_in_flight_when_the_ring_moved_on_is_lost_not_counted_twice():
    cur = fr.Cursor()
    cur.update(fr.parse(json.dumps({"entries": [entry(0), entry(1, state="started", retired=False, dur=None), entry(2)]}))[1])
    got = cur.update(fr.parse(json.dumps({"entries": [entry(3), entry(4)]}))[1])
    assert got.unmeasured == {fr.OVERFLOW: 1} and [r.record_id for r in got.timed] == [3, 4]


def test_untimed_records_are_counted_as_timing_off_and_before_the_first_step_ignored():
    cur = fr.Cursor()
    got = cur.update(fr.parse(json.dumps({"entries": [entry(0, created=5), entry(1, dur=None, created=20), entry(2, created=30)]}))[1],
                     since_ns=10)
    assert got.unmeasured == {fr.UNTIMED: 1} and [r.record_id for r in got.timed] == [2]


def test_a_coalesced_group_is_timed_once_under_its_members_kind():
    group = [entry(0, seq=7, kind="nccl:_all_gather_base", dur=None), entry(1, seq=7, kind="nccl:_all_gather_base", dur=None),
             entry(2, seq=7, kind="nccl:coalesced", dur=4.0)]
    got = fr.Cursor().update(fr.parse(json.dumps({"entries": group}))[1])
    assert got.unmeasured == {} and [(r.kind, r.duration_s) for r in got.timed] == [("all_gather", 0.004)]


def test_record_ids_that_restart_start_the_cursor_over():
    cur = fr.Cursor()
    cur.update(fr.parse(json.dumps({"entries": [entry(i) for i in range(100, 105)]}))[1])
    got = cur.update(fr.parse(json.dumps({"entries": [entry(0), entry(1)]}))[1])
    assert [r.record_id for r in got.timed] == [0, 1]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.integers(1, 25), st.lists(st.integers(1, 30), min_size=1, max_size=12),
       st.sets(st.integers(0, 300), max_size=30))
def test_property_polls_of_a_ring_count_each_final_record_at_most_once(ring, total_unused, steps, late):
    """Records appear one by one, some retire one poll late; a ring of `ring` entries is polled after
    each batch: every record is reported once, or counted lost, never both, never twice."""
    stream, cur, seen, lost = [], fr.Cursor(), [], 0
    n = 0
    for batch in steps:
        for _ in range(batch):
            stream.append(n)
            n += 1
        entries = [entry(i, dur=None if i in late and i >= n - batch else 1.0,
                         retired=not (i in late and i >= n - batch), state="completed") for i in stream[-ring:]]
        got = cur.update(fr.parse(json.dumps({"entries": entries}))[1])
        seen += [r.record_id for r in got.timed]
        lost += got.unmeasured.get(fr.OVERFLOW, 0)
    assert len(seen) == len(set(seen))
    assert len(seen) + lost <= n
    assert set(seen) >= {i for i in range(n - min(ring, steps[-1]), n - steps[-1])}


# ---- the poller ------------------------------------------------------------------------------

class Sink:
    def __init__(self):
        self.seconds, self.count, self.lost = {}, {}, {}

    def collective_gpu(self, kind, group, seconds, count):
        self.seconds[(kind, group)] = self.seconds.get((kind, group), 0.0) + seconds
        self.count[(kind, group)] = self.count.get((kind, group), 0) + count

    def unmeasured(self, reason, count):
        self.lost[reason] = self.lost.get(reason, 0) + count


def test_poller_totals_equal_the_simulated_gpu_time_and_ignore_set_up():
    res = simulate(Job(ranks=2, steps=20, straggler=1, extra_s=0.01))
    entries = res.entries[0]
    shown = []
    started = [None]
    sink = Sink()
    p = gc.Poller(lambda: dump(shown, ring=50), sink, lambda: started[0])
    shown += entries[:3]                # set-up collectives, before the first step
    p.poll_once()
    started[0] = 0
    for i in range(3, len(entries), 9):
        shown += entries[i:i + 9]
        p.poll_once()
    want = sum(e["duration_ms"] for e in entries[3:]) / 1e3
    assert sum(sink.seconds.values()) == pytest.approx(want, rel=1e-9)
    assert sum(sink.count.values()) == len(entries) - 3 and sink.lost == {}
    assert set(sink.seconds) == {("all_gather", "default_pg"), ("reduce_scatter", "default_pg")}


def test_poller_halves_its_interval_after_an_overflow_and_says_when_the_ring_stays_empty():
    sink, shown = Sink(), []
    p = gc.Poller(lambda: dump(shown, ring=4), sink, lambda: 0, interval_s=1.0)
    for _ in range(gc.EMPTY_POLLS):
        p.poll_once()
    assert sink.lost == {gc.NO_RECORDS: 1}
    shown += [entry(i) for i in range(2)]
    p.poll_once()
    shown += [entry(i) for i in range(2, 12)]
    p.poll_once()
    assert sink.lost[fr.OVERFLOW] == 6 and p.interval_s == 0.5


def test_a_failing_dump_stops_polling_and_is_counted_never_raised():
    sink = Sink()

    def broken():
        raise RuntimeError("driver gone")
    p = gc.Poller(broken, sink, lambda: 0, interval_s=0.01).start()
    p._thread.join(5)
    assert not p._thread.is_alive() and sink.lost == {gc.DUMP_FAILED: 1} and "driver gone" in p.error


@pytest.mark.parametrize("env, reason, after", [
    ({}, None, {"TORCH_NCCL_ENABLE_TIMING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}),
    ({"TORCH_NCCL_ENABLE_TIMING": "0"}, fr.UNTIMED, {"TORCH_NCCL_ENABLE_TIMING": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}),
    ({"TORCH_FR_BUFFER_SIZE": "500"}, None, {"TORCH_FR_BUFFER_SIZE": "500", "TORCH_NCCL_ENABLE_TIMING": "1"}),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, gc.NO_RECORDER, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_ENABLE_TIMING": "1"}),
    ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, gc.MAX_CONNECTIONS, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
])
def test_prepare_env_respects_the_users_choice(env, reason, after):
    assert gc.prepare_env(env) == reason and env == after


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE",
                                        "CUDA_DEVICE_MAX_CONNECTIONS"]), st.sampled_from(["", "0", "1", "2000", "off", " 1 "])))
def test_property_prepare_env_never_overrides_a_set_variable(env):
    before = dict(env)
    reason = gc.prepare_env(env)
    assert all(env[k] == v for k, v in before.items() if v.strip())   # blank counts as unset
    assert reason in (None, *fr.REASONS, gc.NO_RECORDER, gc.MAX_CONNECTIONS)
    if reason is None:
        assert env["TORCH_NCCL_ENABLE_TIMING"].strip().lower() not in gc.OFF


# ---- real dumps (gloo records to the generic Flight Recorder on torch >= 2.10, without durations) ----

GLOO_JOB = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    import torch._C._distributed_c10d as c
    from otel_gpu.training import flight_recorder as fr, gpu_collectives as gc
    dist.init_process_group("gloo", rank=0, world_size=1)
    x = torch.ones(64)
    for _ in range(5):
        dist.all_reduce(x); dist.all_gather_into_tensor(torch.empty(64), x, async_op=True).wait(); dist.broadcast(x, 0)
    handler = gc.handler_dump(c, "fr_trace_json")
    _, a = fr.parse(c._dump_fr_trace_json())
    _, b = fr.parse(c._dump_fr_trace(includeStackTraces=True))
    _, h = fr.parse(handler())
    class Sink:
        lost = {}
        def collective_gpu(self, *a): raise AssertionError("gloo has no GPU time")
        def unmeasured(self, reason, n): self.lost[reason] = self.lost.get(reason, 0) + n
    s = Sink()
    gc.Poller(handler, s, lambda: 0).poll_once()
    print(json.dumps({"same": a == b == h, "n": len(a), "kinds": sorted({r.kind for r in a}), "lost": s.lost,
                      "final": all(r.final for r in a)}))
""")


def test_real_gloo_dumps_parse_the_same_every_way_and_count_as_untimed(tmp_path):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    import torch._C._distributed_c10d as c
    if not hasattr(c, "_dump_fr_trace_json"):
        pytest.skip("this torch has no generic Flight Recorder (torch < 2.8)")
    env = clean_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), TORCH_FR_BUFFER_SIZE="100")
    p = subprocess.run([sys.executable, "-c", GLOO_JOB], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {"same": True, "n": 15, "kinds": ["all_gather", "all_reduce", "broadcast"], "lost": {fr.UNTIMED: 15},
                   "final": True}


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 50), st.integers(0, 30), st.one_of(st.none(), st.integers(0, 60)))
def test_property_skipping_read_records_changes_nothing_the_cursor_reports(lo, n, start):
    """parse(min_id=next_id) is only a shortcut: the cursor reports the same records either way (a ring
    holds a contiguous range of ids)."""
    ids = range(lo, lo + n)
    doc = json.dumps({"entries": [entry(i, dur=None if i % 7 == 0 else 1.0) for i in ids]})
    a, b = fr.Cursor(), fr.Cursor()
    if start is not None:
        warm = json.dumps({"entries": [entry(i) for i in range(start, start + 3)]})
        a.update(fr.parse(warm)[1])
        b.update(fr.parse(warm)[1])
    assert a.update(fr.parse(doc)[1]) == b.update(fr.parse(doc, min_id=b.next_id)[1])


# ---- bounds: a dump never stops the job's exit, nor the rest of the run's timing ------------------

def test_an_entry_with_a_bad_duration_is_untimed_and_the_rest_of_the_dump_is_read():
    bad = [{**entry(i, dur=d)} for i, d in enumerate([-1.0, 2.0, 1e13, 3.0])]
    bad.append({**entry(4, dur=1.0), "duration_ms": float("nan")})
    _, recs = fr.parse(pickle.dumps({"entries": bad}))
    assert [r.duration_s for r in recs] == [None, 0.002, None, 0.003, None]
    got = fr.Cursor().update(recs)
    assert len(got.timed) == 2 and got.unmeasured == {fr.UNTIMED: 3}


def test_a_dump_past_its_bounds_is_one_line(monkeypatch):
    monkeypatch.setattr(fr, "MAX_ENTRIES", 10)
    many = {"entries": [entry(i) for i in range(11)]}
    for data in (json.dumps(many), pickle.dumps(many), many):
        with pytest.raises(fr.FlightRecorderError, match="11 entries is over its bound of 10"):
            fr.parse(data)
    monkeypatch.setattr(fr, "MAX_DUMP_BYTES", 100)
    with pytest.raises(fr.FlightRecorderError, match="over its bound"):
        fr.parse(json.dumps({"entries": [entry(0)] * 3}))


HANG = """
import sys, threading, time
from otel_gpu.training import gpu_collectives as gc

class Sink:
    def collective_gpu(self, *a): pass
    def unmeasured(self, *a): pass

hang = threading.Event()
def dump():
    if hang.is_set():
        threading.Event().wait()   # a dump that never returns
    return '{"entries": []}'

if sys.argv[1] == "every":
    hang.set()
gc.launch(dump, Sink(), lambda: 0, interval_s=0.05)
time.sleep(0.3)
hang.set()                         # "last": the polls so far returned, the last one would not
t = time.monotonic()
gc.stop()
print(f"stopped {time.monotonic() - t:.2f}", flush=True)
"""


@pytest.mark.parametrize("which", ["every", "last"])
def test_a_dump_that_never_returns_does_not_hold_the_process_exit(which):
    proc = subprocess.run([sys.executable, "-c", HANG, which], env=clean_env(), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.split()[1]) < 3.0
