"""The communication rule on hand-built windows: a rank's collective wait is measured between steps too
(the HF Trainer's token-count all-gather in its batch fetch), so its share is of the rank's wall time,
not of step time; ZeRO-3 is named only on evidence of it (all-gathers inside forward/backward, or
ZeRO-3's functions in the profiles), any other all-gather is communication of its kind; waits for a
slower saver are the checkpoint rule's."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.diagnose.comm import LATENCY_SPACE, comm_bound, measured_on_s, waits_beside_saves
from otel_gpu.diagnose.model import RankStats
from otel_gpu.diagnose.profiles import from_samples
from otel_gpu.diagnose.thresholds import Thresholds

from .windows import T0, window

TH = Thresholds()


def hf_rank(r: int, gather: float, ddp: float, *, wall: float = 160.0, steps: int = 100, step_s: float = 1.0,
            fetch_phase: str = "data_wait", checkpoint: float = 0.0, eval_s: float = 0.0,
            eval_wait: float = 0.0) -> RankStats:
    """An HF-Trainer-like rank: `steps` steps of `step_s` over `wall` seconds; `gather` seconds of all-gather
    waits in `fetch_phase` (data_wait: the Trainer's token count, between steps), `ddp` seconds of DDP's
    all-reduce wait in backward; a save of `checkpoint` seconds; an evaluation of `eval_s` (+ `eval_wait`)."""
    by_phase = {fetch_phase: gather, "backward": ddp}
    if eval_wait:
        by_phase["eval"] = eval_wait
    phases = {"data_wait": 1.0, "forward": 30.0, "backward": 40.0, "optimizer": 5.0}
    if checkpoint:
        phases["checkpoint"] = checkpoint
    if eval_s:
        phases["eval"] = eval_s
    return RankStats(rank=str(r), host="n0", steps=steps, step_time_s=steps * step_s, step_count=steps,
                     phases=phases, samples=int(wall / 5) + 1, first_t=T0 + 5, last_t=T0 + wall,
                     collective_s=gather + ddp, collective_by_phase=by_phase,
                     collective_by_kind={"all_gather": gather, "ddp_allreduce": ddp},   # outside eval, as collective_s
                     param_gather_s=gather if fetch_phase in ("forward", "backward") else 0.0,
                     collective_basis="host")


def only(findings):
    assert len(findings) == 1, [(f.severity, f.title) for f in findings]
    return findings[0]


def test_waits_between_steps_are_a_share_of_wall_time_not_of_step_time():
    # 30 s of waits per rank: 30% of the 100 s of steps, but the waits fall in 160 s of wall time
    w = window(ranks=[hf_rank(0, 20.0, 10.0), hf_rank(1, 20.0, 10.0)], duration=200.0)
    assert measured_on_s(w, w.ranks[0]) == pytest.approx(160.0)
    assert comm_bound(w, TH) == []                      # 18.75% of the ranks' time: below the warning share
    w = window(ranks=[hf_rank(0, 40.0, 10.0), hf_rank(1, 45.0, 10.0)], duration=200.0)
    f = only(comm_bound(w, TH))
    assert f.evidence["wait_share"] == pytest.approx(50 / 160, abs=1e-4) and f.severity == "warning"
    assert f.evidence["least_rank"] == "0" and f.evidence["wall_per_step_s"] == pytest.approx(1.6)
    assert f.evidence["wait_per_step_s"] == pytest.approx(0.5) and f.evidence["mean_step_s"] == pytest.approx(1.0)
    assert "of its time" in f.title and "500 ms per step" in f.seen and "of its 1.6 s of wall time per step" in f.seen
    assert f.lost_s == pytest.approx(50 / 160 * 320)    # what every rank waits, over both ranks' wall time


def test_an_all_gather_between_steps_is_not_zero3():
    w = window(ranks=[hf_rank(0, 40.0, 20.0), hf_rank(1, 40.0, 20.0)], duration=200.0)
    f = only(comm_bound(w, TH))
    assert f.title.startswith("communication wait (all-gather, ddp-allreduce): ") and "ZeRO" not in f.title
    assert f.evidence["zero"] is False and f.tune_space is None
    assert "ZeRO" not in f.action and "bucket" in f.action


def test_all_gathers_inside_forward_and_backward_are_zero3():
    w = window(ranks=[hf_rank(r, 40.0, 20.0, fetch_phase="forward") for r in (0, 1)], duration=200.0)
    f = only(comm_bound(w, TH))
    assert f.title.startswith("ZeRO-3 communication wait: ") and f.evidence["zero"] is True
    assert "parameter fetch" in f.evidence["zero_evidence"] and "ZeRO-3: all-gathers inside forward/backward" in f.seen
    assert f.tune_space == LATENCY_SPACE and "otel-gpu tune" in f.action
    # a few all-gathers in the passes among mostly other waits: not enough to call the job ZeRO-3
    w = window(ranks=[hf_rank(r, 4.0, 56.0, fetch_phase="forward") for r in (0, 1)], duration=200.0)
    assert only(comm_bound(w, TH)).evidence["zero"] is False


def _profile(zero: bool):
    fetch = ["all_gather_into_tensor", "fetch_sub_module" if zero else "_gather", "forward", "main"]
    return from_samples([(fetch, 30e9, {"phase": "forward"}, {"rank": "0"}),
                         (["matmul", "forward", "main"], 70e9, {"phase": "forward"}, {"rank": "0"})])


def test_profiles_when_read_decide_zero3():
    w = window(ranks=[hf_rank(r, 40.0, 20.0) for r in (0, 1)], duration=200.0)
    w.profile = _profile(zero=True)
    f = only(comm_bound(w, TH))
    assert f.evidence["zero"] is True and "functions in the profiles" in f.evidence["zero_evidence"]
    w = window(ranks=[hf_rank(r, 40.0, 20.0, fetch_phase="forward") for r in (0, 1)], duration=200.0)
    w.profile = _profile(zero=False)   # gathers in the passes without DeepSpeed's functions (FSDP, tensor parallel)
    assert only(comm_bound(w, TH)).evidence["zero"] is False


def test_waiting_for_a_slower_saver_is_not_communication():
    # rank 0 saves 30 s; rank 1 waits for it in the next token-count all-gather; both wait 25 s otherwise
    ranks = [hf_rank(0, 15.0, 10.0, checkpoint=30.0), hf_rank(1, 45.0, 10.0, checkpoint=0.5)]
    assert waits_beside_saves(ranks) == {"0": 25.0, "1": pytest.approx(25.5)}
    assert comm_bound(window(ranks=ranks, duration=200.0), TH) == []   # 25 / 160 s: below the warning share


def test_evaluation_is_not_the_time_waits_are_measured_on():
    r = hf_rank(0, 30.0, 10.0, eval_s=30.0, eval_wait=10.0)
    w = window(ranks=[r, hf_rank(1, 30.0, 10.0, eval_s=30.0, eval_wait=10.0)], duration=200.0)
    assert measured_on_s(w, r) == pytest.approx(120.0)
    f = only(comm_bound(w, TH))
    assert f.evidence["wait_share"] == pytest.approx(40 / 120, abs=1e-4)   # eval's own wait is not counted either


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 60), st.floats(0, 30), st.floats(0, 20), st.floats(100, 190)),
                min_size=1, max_size=4))
def test_property_the_share_is_the_least_ranks_wait_over_its_measured_time(spec):
    ranks = [hf_rank(i, g, d, checkpoint=c, wall=wall) for i, (g, d, c, wall) in enumerate(spec)]
    w = window(ranks=ranks, duration=200.0)
    waits = waits_beside_saves(ranks)
    least = min(waits[r.rank] / measured_on_s(w, r) for r in ranks)
    found = comm_bound(w, TH)
    if least < TH["comm"]["wait_share_warning"]:
        assert found == []
    else:
        f = only(found)
        assert f.evidence["wait_share"] == pytest.approx(least, abs=1e-4)
        assert f.lost_s == pytest.approx(f.lost_share * sum(measured_on_s(w, r) for r in ranks))
        assert f.evidence["zero"] is False and f.tune_space is None


# ---- waits inside eval: in neither the total nor its breakdown by kind, on both diagnosis paths ----

def _eval_job_points(t0: float, job: str):
    """Two ranks exporting every 5 s for 200 s: per export 2 steps of 0.8 s, forward and backward 0.5 s each,
    1.5 s of DDP all-reduce wait in backward, and an evaluation of 1 s with a 0.9 s metric all-reduce in it."""
    from otel_gpu import names as N
    from otel_gpu.record.decode import Point

    res = (("host.name", "n0"), ("otelgpu.job", job))
    for i in range(1, 41):
        t, pts = t0 + 5 * i, []
        for r in ("0", "1"):
            a = (("host.name", "n0"), ("otelgpu.job", job), ("otelgpu.rank", r), ("otelgpu.world_size", "2"))
            n = 2 * i
            pts += [Point(N.TRAIN_STEPS.name, "counter", "{step}", "cumulative", res, a, t, n),
                    Point(N.TRAIN_STEP_DURATION.name, "histogram", "s", "cumulative", res, a, t, 0.8 * n, n,
                          (n, 0), (1.0,))]
            for phase, v in (("forward", 0.5), ("backward", 0.5), ("eval", 1.0)):
                pts.append(Point(N.TRAIN_PHASE_TIME.name, "counter", "s", "cumulative", res, a + ((N.PHASE, phase),),
                                 t, v * i))
            for phase, kind, v in (("backward", "ddp_allreduce", 1.5), ("eval", "all_reduce", 0.9)):
                pts.append(Point(N.TRAIN_COLLECTIVE_TIME.name, "counter", "s", "cumulative", res,
                                 a + ((N.COLLECTIVE, kind), (N.COLLECTIVE_BASIS, "host"), (N.PHASE, phase)), t, v * i))
        yield t, pts


def _prometheus_lines(points) -> str:
    """The points as Prometheus text with timestamps, named as the OTLP translation names them."""
    from otel_gpu import names as N

    names = {N.TRAIN_STEPS.name: N.TRAIN_STEPS.prometheus_name(), N.TRAIN_PHASE_TIME.name:
             N.TRAIN_PHASE_TIME.prometheus_name(), N.TRAIN_COLLECTIVE_TIME.name: N.TRAIN_COLLECTIVE_TIME.prometheus_name()}
    hist = N.TRAIN_STEP_DURATION.prometheus_name()
    out = []
    for p in points:
        labels = {k.replace(".", "_"): v for k, v in (*p.resource, *p.attrs)}
        ms = int(p.t * 1000)
        fmt_ = lambda extra: "{" + ",".join(f'{k}="{v}"' for k, v in {**labels, **extra}.items()) + "}"   # noqa: E731
        if p.kind == "histogram":
            out += [f"{hist}_sum{fmt_({})} {p.value} {ms}", f"{hist}_count{fmt_({})} {p.count} {ms}",
                    f"{hist}_bucket{fmt_({'le': '1'})} {p.buckets[0]} {ms}",
                    f"{hist}_bucket{fmt_({'le': '+Inf'})} {p.count} {ms}"]
        else:
            out.append(f"{names[p.metric]}{fmt_({})} {p.value} {ms}")
    return "\n".join(out) + "\n"


def test_waits_inside_eval_are_left_out_of_the_kinds_on_both_paths(victoriametrics, tmp_path):
    """20 s of DDP all-reduce wait in backward beside 30 s of metric all-reduce in eval printed 'communication
    wait (all-reduce, ddp-allreduce)' with kinds adding up to more than the wait: eval's kinds are left out."""
    import time
    import uuid

    import httpx

    from otel_gpu.diagnose import diagnose
    from otel_gpu.promql import PromClient
    from otel_gpu.record.diagnose import diagnose_recording
    from otel_gpu.record.store import Writer

    job = f"evalkinds-{uuid.uuid4().hex[:8]}"
    t0 = float(int(time.time()) - 400)
    w = Writer(tmp_path / "run", {"job": job, "host": "n0", "started": repr(t0), "ended": repr(t0 + 201.0),
                                  "exit_status": "0", "command": '["python", "train.py"]'})
    every = []
    for _, pts in _eval_job_points(t0, job):
        w.add_points(pts)
        every += pts
    w.close()
    r = httpx.post(f"{victoriametrics.url}/api/v1/import/prometheus", content=_prometheus_lines(every), timeout=30)
    assert r.status_code == 204, r.text
    victoriametrics.flush()
    recorded = diagnose_recording([tmp_path / "run"])
    win = recorded.window
    with PromClient(victoriametrics.url) as client:
        served = diagnose(client, job, win.start, win.end)
    for report in (recorded, served):
        ranks = report.window.ranks
        assert [x.rank for x in ranks] == ["0", "1"]
        for x in ranks:
            assert x.collective_by_kind == pytest.approx({"ddp_allreduce": 60.0}), x.collective_by_kind
            assert x.collective_s == pytest.approx(sum(x.collective_by_kind.values()))
            assert x.collective_by_phase == pytest.approx({"backward": 60.0, "eval": 36.0})
        f = only([f for f in report.findings if f.rule == "comm"])
        assert f.title.startswith("communication wait (ddp-allreduce): "), f.title
        assert f.evidence["by_kind_s"] == pytest.approx({"ddp_allreduce": f.evidence["wait_per_step_s"]}, rel=1e-3)
        assert "all-reduce " not in f.seen, f.seen
    mine, theirs = (only([f for f in x.findings if f.rule == "comm"]) for x in (recorded, served))
    assert mine.severity == theirs.severity and mine.lost_share == pytest.approx(theirs.lost_share, abs=0.01)
