"""The stall rule on hand-built windows: who holds the others up, from host waits, Flight Recorder sequence
numbers or a rank that went away; nothing on a job that steps, saves or evaluates; the parsing of its
inputs from PromQL answers (Hypothesis)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.diagnose import run_rules
from otel_gpu.diagnose.model import RankStats
from otel_gpu.diagnose.parse import parse_ranks
from otel_gpu.diagnose.queries import Q
from otel_gpu.diagnose.stall import stall
from otel_gpu.diagnose.thresholds import Thresholds
from otel_gpu.promql import Series

from .windows import T0, window

TH = Thresholds()
END = T0 + 600.0


def rk(r: int, *, last_step: float, step_s: float = 1.0, open_s: dict[str, float] | None = None,
       seq: dict[str, dict[str, float]] | None = None, last_t: float = END, host: str | None = None,
       recent_outside: float | None = None, steps_total: float = 1204) -> RankStats:
    """A rank that stepped every `step_s` until `last_step` (unix s) and exported until `last_t`."""
    return RankStats(rank=str(r), host=host or f"n{r // 8}", steps=100, step_time_s=100 * step_s, step_count=100,
                     samples=60, first_t=T0 + 5, last_t=last_t, collective_s=0.0, step_last_t=last_step,
                     steps_total=steps_total, life_step_s=step_s, collective_open=dict(open_s or {}),
                     collective_seq=dict(seq or {}), recent_outside_s=recent_outside)


def one(w, th=TH):
    found = stall(w, th)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("holder", [0, 1, 3])
def test_gloo_names_the_rank_not_inside_a_collective(holder):
    since = END - 300
    ranks = [rk(r, last_step=since - (1 if r == holder else 0),
                open_s={"ddp_allreduce": 0.0 if r == holder else 299.0}) for r in range(4)]
    f = one(window(ranks, duration=600))
    assert f.severity == "critical" and f.confidence == "high"
    assert f.where == {"ranks": [str(holder)], "nodes": ["n0"]}
    assert f.evidence["since"] == since and f.evidence["attribution"] == "host_waits"
    assert "no step since" in f.seen and "step 1,204 on rank" in f.seen and "ddp_allreduce" in f.seen
    assert f"rank {holder} holds the others up" in f.title
    assert f.ranges == [(since, END)]


def test_a_job_with_50_s_steps_is_not_stalled_between_two_steps():
    w = window([rk(r, last_step=END - 300, step_s=50.0, open_s={"all_reduce": 0.0}) for r in range(2)], duration=600)
    assert stall(w, TH) == []            # 300 s < 10 x 50 s
    w = window([rk(r, last_step=END - 510, step_s=50.0, open_s={"all_reduce": 0.0 if r else 505.0})
                for r in range(2)], duration=600)
    assert one(w).where["ranks"] == ["1"]   # 510 s > 500 s


def test_the_limit_is_at_least_min_s_and_the_window_mean_counts_too():
    fast = [rk(r, last_step=END - 100, step_s=0.05) for r in range(2)]
    assert stall(window(fast, duration=600), TH) == []     # 100 s < 120 s
    slow_now = [rk(r, last_step=END - 200, step_s=0.05) for r in range(2)]
    for r in slow_now:
        r.step_time_s = r.step_count * 30.0    # the window's steps took 30 s each: 300 s limit
    assert stall(window(slow_now, duration=600), TH) == []


def test_saving_or_evaluating_is_not_a_stall_but_a_hang_inside_a_save_is():
    ranks = [rk(r, last_step=END - 200, recent_outside=58.0) for r in range(2)]
    assert stall(window(ranks, duration=600), TH) == []
    ranks = [rk(0, last_step=END - 200, recent_outside=58.0, open_s={"barrier": 0.0}),   # writing, or stuck writing
             rk(1, last_step=END - 200, recent_outside=5.0, open_s={"barrier": 190.0})]   # waits in the save's barrier
    assert one(window(ranks, duration=600)).where["ranks"] == ["0"]


def test_nccl_names_the_rank_behind_on_one_process_group():
    seq = lambda started_tp: {"default_pg": {"started": 900, "completed": 900},   # noqa: E731
                              "tp": {"started": started_tp, "completed": 411}}
    ranks = [rk(r, last_step=END - 400, seq=seq(411 if r == 2 else 412)) for r in range(4)]
    f = one(window(ranks, duration=600))
    assert f.where["ranks"] == ["2"] and f.confidence == "high" and f.evidence["attribution"] == "flight_recorder"
    assert f.evidence["behind"] == {"tp": ["2"]}
    assert "process group tp" in f.seen and "#412" in f.seen and "#411" in f.seen


def test_nccl_every_rank_inside_the_same_collective_names_every_rank():
    ranks = [rk(r, last_step=END - 400, seq={"default_pg": {"started": 77, "completed": 76}}) for r in range(2)]
    f = one(window(ranks, duration=600))
    assert f.where["ranks"] == ["0", "1"] and f.confidence == "medium" and "does not finish" in f.seen


def test_no_collective_data_names_every_rank_with_low_confidence():
    f = one(window([rk(r, last_step=END - 400) for r in range(3)], duration=600))
    assert f.confidence == "low" and f.where["ranks"] == ["0", "1", "2"]
    assert "cannot be told" in f.seen and "not known" in f.title


def test_nobody_inside_a_collective_is_said():
    f = one(window([rk(r, last_step=END - 400, open_s={"all_reduce": 0.0}) for r in range(2)], duration=600))
    assert f.confidence == "low" and "no rank is inside a collective" in f.seen.lower()


def test_different_collectives_everywhere_is_a_mismatch():
    ranks = [rk(0, last_step=END - 400, open_s={"all_reduce": 395.0}), rk(1, last_step=END - 400, open_s={"broadcast": 395.0})]
    f = one(window(ranks, duration=600))
    assert f.confidence == "medium" and "different order" in f.seen and f.where["ranks"] == ["0", "1"]


def test_a_rank_gone_during_the_stall_holds_the_others():
    ranks = [rk(0, last_step=END - 400, open_s={"all_reduce": 395.0}), rk(1, last_step=END - 401, last_t=END - 300,
                                                                           open_s={"all_reduce": 0.0})]
    f = one(window(ranks, duration=600))
    assert f.where["ranks"] == ["1"] and f.evidence["gone"] == ["1"] and "may have died" in f.seen


def test_the_only_rank():
    f = one(window([rk(0, last_step=END - 400)], duration=600))
    assert f.where["ranks"] == ["0"] and f.confidence == "medium"


def test_no_latest_step_gauge_no_finding_and_other_rules_unchanged():
    old = [rk(r, last_step=END - 400) for r in range(2)]
    for r in old:
        r.step_last_t = None
    w = window(old, duration=600)
    assert stall(w, TH) == [] and not [f for f in run_rules(w) if f.rule == "stall"]


def test_the_thresholds_apply():
    ranks = [rk(r, last_step=END - 10, step_s=0.05, open_s={"all_reduce": 0.0 if r else 9.5}) for r in range(2)]
    assert stall(window(ranks, duration=600), TH) == []
    f = one(window(ranks, duration=600), Thresholds({"stall": {"min_s": 5.0}}))
    assert f.where["ranks"] == ["1"] and f.evidence["limit_s"] == 5.0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 16), data=st.data(), silence=st.floats(130, 5000), nccl=st.booleans())
def test_exactly_the_holders_are_named(n, data, silence, nccl):
    holders = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))
    since = END - silence
    ranks = []
    for r in range(n):
        if nccl:
            ranks.append(rk(r, last_step=since, seq={"g": {"started": 10 if r in holders else 11, "completed": 10}}))
        else:
            ranks.append(rk(r, last_step=since, open_s={"all_reduce": 0.0 if r in holders else silence - 1}))
    f = one(window(ranks, duration=6000))
    assert f.where["ranks"] == [str(r) for r in sorted(holders)]


@settings(max_examples=60, deadline=None)
@given(silence=st.floats(0, 119.9), step_s=st.floats(0.01, 60), n=st.integers(1, 8))
def test_never_fires_under_the_limit(silence, step_s, n):
    ranks = [rk(r, last_step=END - min(silence, 9.99 * step_s), step_s=step_s) for r in range(n)]
    assert stall(window(ranks, duration=600), TH) == []


# ---- parsing the PromQL answers ----------------------------------------------------------------

def _series(q: str, value: float, rank: str = "0", **labels: str) -> Series:
    return Series({"host_name": "n0", "otelgpu_rank": rank, Q: q, **labels}, [(END, value)])


finite = st.floats(0, 1e9, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(step_last=finite, steps=st.integers(1, 10**7), total=finite, opens=st.dictionaries(
       st.sampled_from(["all_reduce", "ddp_allreduce", "barrier", "broadcast"]), finite, max_size=3),
       seqs=st.dictionaries(st.text("abcdefgh_0123", min_size=1, max_size=12),
                            st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=3),
       recent=st.none() | finite)
def test_parse_ranks_reads_the_stall_inputs(step_last, steps, total, opens, seqs, recent):
    result = [_series("steps", steps), _series("steplast", step_last), _series("step_sum", total),
              _series("step_count", steps)]
    result += [_series(f"open_{k}", v) for k, v in opens.items()]
    for g, (s, c) in seqs.items():
        result += [_series(f"seqs_{g}", s), _series(f"seqc_{g}", c)]
    if recent is not None:
        result.append(_series("recent_ph", recent))
    (r,) = parse_ranks(result)
    assert r.step_last_t == step_last and r.steps_total == steps
    assert r.life_step_s == pytest.approx(total / steps)
    assert r.collective_open == opens
    assert r.collective_seq == {g: {"started": s, "completed": c} for g, (s, c) in seqs.items()}
    assert r.recent_outside_s == recent


def test_parse_ranks_without_the_stall_series_leaves_them_unset():
    (r,) = parse_ranks([_series("steps", 5)])
    assert r.step_last_t is None and r.collective_open == {} and r.collective_seq == {} and r.recent_outside_s is None
