"""The three gauges a stall is judged on, from a real session's instruments: the latest step's end, the
host wait still open (per kind, 0 when none, nested waits once, read from another thread), and the
Flight Recorder sequence numbers per process group; then synthetic NCCL ranks, one behind on one
group, through the real poller and sink to the stall rule."""
from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu import names
from otel_gpu.diagnose.model import RankStats, Window
from otel_gpu.diagnose.stall import stall
from otel_gpu.diagnose.thresholds import Thresholds
from otel_gpu.training import flight_recorder as fr
from otel_gpu.training import gpu_collectives as gc
from otel_gpu.training.session import Session

from tests.training.fr_synth import FR_NAMES, Job, dump, simulate


def _points(reader) -> dict[str, list]:
    out = {}
    data = reader.get_metrics_data()   # None when no instrument has a point
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = list(m.data.data_points)
    return out


@pytest.fixture
def session():
    reader = InMemoryMetricReader()
    s = Session({"RANK": "1", "WORLD_SIZE": "2", "OTELGPU_JOB": "unit"}, readers=[reader], profile=False, host="h")
    s.reader = reader
    yield s
    s.shutdown()


def test_step_last_is_absent_before_the_first_step_then_the_end_of_the_latest(session):
    assert names.TRAIN_STEP_LAST.name not in _points(session.reader)
    t = session.timer
    for _ in range(3):
        with t.step():
            time.sleep(0.01)
        ended = time.time()
    (p,) = _points(session.reader)[names.TRAIN_STEP_LAST.name]
    assert ended - 0.05 <= p.value <= ended and p.attributes[names.RANK] == "1"


def test_open_wait_is_counted_at_export_once_per_nesting_and_zero_after(session):
    t = session.timer
    now = [100.0]
    t.clock = lambda: now[0]
    assert names.TRAIN_COLLECTIVE_OPEN.name not in _points(session.reader)   # no host wait seen yet
    with t.step():
        outer = t.wait_begin("all_reduce")
        now[0] += 2.0
        inner = t.wait_begin("barrier")      # a collective inside another: counted by the outer one only
        now[0] += 3.0
        (p,) = _points(session.reader)[names.TRAIN_COLLECTIVE_OPEN.name]
        assert p.value == pytest.approx(5.0) and p.attributes[names.COLLECTIVE] == "all_reduce"
        t.wait_end(None, inner)
        now[0] += 1.0
        (p,) = _points(session.reader)[names.TRAIN_COLLECTIVE_OPEN.name]
        assert p.value == pytest.approx(6.0)
        t.wait_end("all_reduce", outer)
    # not inside any more: 0 is exported, so "not inside" is a value, not a missing series
    (p,) = _points(session.reader)[names.TRAIN_COLLECTIVE_OPEN.name]
    assert p.value == 0.0 and p.attributes[names.COLLECTIVE] == "all_reduce"


def test_a_wait_on_another_thread_is_seen_while_it_blocks(session):
    t = session.timer
    entered, release = threading.Event(), threading.Event()

    def blocked():
        token = t.wait_begin("ddp_allreduce")
        entered.set()
        release.wait(10)
        t.wait_end("ddp_allreduce", token)

    th = threading.Thread(target=blocked)
    th.start()
    try:
        assert entered.wait(5)
        time.sleep(0.3)
        (p,) = _points(session.reader)[names.TRAIN_COLLECTIVE_OPEN.name]
        assert 0.3 <= p.value < 5 and p.attributes[names.COLLECTIVE] == "ddp_allreduce"
    finally:
        release.set()
        th.join(5)
    (p,) = _points(session.reader)[names.TRAIN_COLLECTIVE_OPEN.name]
    assert p.value == 0.0


def _entry(rid: int, seq: int, group: tuple[str, str], state: str, kind: str = "all_reduce") -> dict:
    done = state == "completed"
    return {"record_id": rid, "pg_id": int(group[0]), "process_group": list(group), "collective_seq_id": seq,
            "p2p_seq_id": 0, "profiling_name": FR_NAMES[kind], "time_created_ns": 1_790_000_000_000_000_000 + rid,
            "duration_ms": 1.0 if done else None, "state": state, "retired": done, "is_p2p": False}


def test_last_seqs_per_group_and_state_leave_point_to_point_out():
    recs = fr.parse(dump([_entry(0, 5, ("0", "default_pg"), "completed"), _entry(1, 6, ("0", "default_pg"), "started"),
                          _entry(2, 9, ("1", "tp"), "scheduled"),
                          {**_entry(3, 40, ("0", "default_pg"), "started"), "is_p2p": True, "p2p_seq_id": 40}]))[1]
    assert fr.last_seqs(recs) == {("default_pg", "started"): 6, ("default_pg", "completed"): 5}


def _rank_entries(rank: int, base: list[dict], tp_done: int, hang_on_tp: bool) -> list[dict]:
    """A rank's ring: the simulated default-group collectives, `tp_done` completed ones on group "tp", then
    (unless it is the rank that never arrived) the next "tp" collective started and not completed."""
    out = list(base)
    rid = len(out)
    for seq in range(1, tp_done + 1):
        out.append(_entry(rid, seq, ("1", "tp"), "completed"))
        rid += 1
    if hang_on_tp:
        out.append(_entry(rid, tp_done + 1, ("1", "tp"), "started"))
    return out


@pytest.mark.parametrize("behind", [0, 2])
def test_nccl_rank_behind_on_one_group_is_named_through_poller_and_sink(behind):
    """Each rank's real session and poller read its own synthetic Flight Recorder ring; the stall rule,
    fed the exported gauges, names the rank that never started the group's next collective."""
    world = 4
    res = simulate(Job(ranks=world, steps=10))
    end = time.time()
    ranks = []
    for r in range(world):
        reader = InMemoryMetricReader()
        s = Session({"RANK": str(r), "WORLD_SIZE": str(world)}, readers=[reader], profile=False, host=f"n{r // 2}")
        try:
            ring = _rank_entries(r, res.entries[r], tp_done=30, hang_on_tp=r != behind)
            gc.Poller(lambda ring=ring: dump(ring), s.sink, lambda: 0).poll_once()
            with s.timer.step():
                pass
            s.sink.step_last = end - 900   # the stall began 15 minutes ago
            pts = _points(reader)
        finally:
            s.shutdown()
        seqs: dict[str, dict[str, float]] = {}
        for p in pts[names.TRAIN_COLLECTIVE_SEQ.name]:
            seqs.setdefault(p.attributes[names.PROCESS_GROUP], {})[p.attributes[names.COLLECTIVE_STATE]] = p.value
        assert seqs["tp"] == {"started": 30 if r == behind else 31, "completed": 30}
        assert seqs["default_pg"]["started"] == seqs["default_pg"]["completed"] == 30   # 10 steps x 3
        (last,) = pts[names.TRAIN_STEP_LAST.name]
        ranks.append(RankStats(rank=str(r), host=f"n{r // 2}", steps=1, step_time_s=0.05, step_count=1,
                               last_t=end, step_last_t=last.value, steps_total=1, collective_seq=seqs))
    (f,) = stall(Window(job="j", start=end - 1800, end=end, ranks=ranks), Thresholds())
    assert f.where == {"ranks": [str(behind)], "nodes": [f"n{behind // 2}"]}
    assert f.evidence["behind"] == {"tp": [str(behind)]} and f.evidence["since"] == pytest.approx(end - 900)
    assert "process group tp" in f.seen and f.confidence == "high"
