"""Each rule as a pure function over hand-built windows: the finding, its numbers, and when it stays quiet."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.diagnose import RULES, run_rules
from otel_gpu.diagnose.comm import BANDWIDTH_SPACE, LATENCY_SPACE, comm_bound
from otel_gpu.diagnose.findings import Finding, rank_findings
from otel_gpu.diagnose.periodic import periodic_stalls
from otel_gpu.diagnose.profiles import from_samples
from otel_gpu.diagnose.rules_gpu import memory_pressure, sm_idle, throttling
from otel_gpu.diagnose.rules_train import MORE_WORKERS, checkpoint, input_bound
from otel_gpu.diagnose.straggler import straggler
from otel_gpu.diagnose.thresholds import Thresholds
from otel_gpu.diagnose.window import Timeline

from .windows import gpu, grid, node, rank, window

TH = Thresholds()


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.title for f in findings]
    return findings[0]


# ---- SMs idle behind utilization -------------------------------------------------------------

def test_sm_idle_case_study_numbers():
    w = window(ranks=[rank(i) for i in range(8)], gpus=[gpu(i, util=0.991, sm=0.213) for i in range(8)])
    f = only(sm_idle(w, TH))
    assert "99.1%" in f.title and "21.3%" in f.title
    assert f.severity == "critical" and f.confidence == "high"
    assert f.lost_share == pytest.approx(0.991 - 0.213, abs=1e-6)
    assert f.lost_s == pytest.approx(8 * 120 * (0.991 - 0.213))
    assert f.where["ranks"] == [str(i) for i in range(8)]
    assert " on all 8 GPUs " in f.seen
    one = only(sm_idle(window(gpus=[gpu(0, util=0.991, sm=0.213)]), TH))
    assert " on the only GPU " in one.seen and "GPUs" not in one.seen


def test_sm_idle_quiet_when_sms_busy_and_says_when_gpm_missing():
    assert sm_idle(window(gpus=[gpu(0, util=0.95, sm=0.7)]), TH) == []
    f = only(sm_idle(window(gpus=[gpu(0, util=0.99, sm=None)]), TH))
    assert f.severity == "info" and f.missing == ["otelgpu_gpu_sm_activity"] and "Hopper" in f.action
    assert only(sm_idle(window(), TH)).missing == ["GPU metrics"]


def test_sm_idle_threshold_override():
    w = window(gpus=[gpu(0, util=0.9, sm=0.5)])
    assert sm_idle(w, TH) == []
    assert len(sm_idle(w, Thresholds({"sm_idle": {"ratio_max": 0.6}}))) == 1


# ---- throttling ------------------------------------------------------------------------------

def test_thermal_throttling_names_the_gpu_and_estimates_from_clocks():
    hot = gpu(3, host="n1", clock_hz=1.5e9, temp_c=88.0, temp_max_c=91.0,
              throttle={"sw_power_cap": 0.0, "hw_thermal_slowdown": 0.5})
    w = window(gpus=[gpu(i) for i in range(3)] + [hot])
    f = only([x for x in throttling(w, TH) if "thermal" in x.title])
    assert f.where["gpus"] == ["n1/gpu3"] and f.where["nodes"] == ["n1"]
    assert "hw_thermal_slowdown active 50.0%" in f.seen and "1500 MHz" in f.seen
    assert f.lost_s == pytest.approx(120 * (1 - 1.5 / 1.98))
    assert f.severity in ("warning", "critical")


def test_power_cap_at_full_clock_is_info_and_missing_reasons_said():
    capped = gpu(0, throttle={"sw_power_cap": 0.9})
    f = only(throttling(window(gpus=[capped, gpu(1)]), TH))
    assert f.severity == "info" and f.lost_s == 0
    f = only(throttling(window(gpus=[gpu(0, throttle={})]), TH))
    assert f.missing == ["otelgpu_gpu_clock_event_active"]


def test_hot_gpu_without_slowdown_is_a_warning():
    f = only(throttling(window(gpus=[gpu(0, temp_max_c=90.0), gpu(1)]), TH))
    assert "hot" in f.title and f.severity == "warning" and f.where["gpus"] == ["n0/gpu0"]


# ---- memory ----------------------------------------------------------------------------------

def test_memory_pressure_gpu_and_swap():
    w = window(gpus=[gpu(0, mem_used_b=79e9), gpu(1)], nodes=[node("n0", swap_used_b=3 * 2**30, swap_pages_per_s=500.0)])
    found = memory_pressure(w, TH)
    assert {f.title.split(" ")[0] for f in found} == {"GPU", "host"}
    gpu_f = next(f for f in found if f.title.startswith("GPU"))
    assert gpu_f.where["gpus"] == ["n0/gpu0"] and "98.8%" in gpu_f.title
    assert next(f for f in found if f.title.startswith("host")).title == "host swapping on 1 node"
    assert memory_pressure(window(gpus=[gpu(0)], nodes=[node()]), TH) == []


# ---- checkpoint ------------------------------------------------------------------------------

def test_checkpoint_share_of_wall_time():
    w = window(ranks=[rank(0, checkpoint=14.4), rank(1, checkpoint=12.0)])
    f = only(checkpoint(w, TH))
    assert f.evidence["share"] == pytest.approx(0.12) and "12.0%" in f.title
    assert f.severity == "critical"
    assert f.lost_s == pytest.approx(14.4 * 2)
    assert checkpoint(window(ranks=[rank(0)]), TH) == []


def test_checkpoint_saves_from_the_timeline_and_advice():
    t = grid()
    ck = [1.0 if (i % 6) in (4, 5) else 0.0 for i in range(len(t))]   # 10 s of every 30 s
    tl = Timeline(t=t, series={"phase_checkpoint": ck, "disk_write": [2e9 if c else 1e6 for c in ck]})
    f = only(checkpoint(window(ranks=[rank(0, checkpoint=40.0)], timeline=tl), TH))
    assert f.evidence["saves"] == 4 and f.evidence["every_s"] == pytest.approx(30.0)
    assert len(f.ranges) == 4 and "2.0 GB/s during saves" in f.seen
    assert "save less often" in f.action


# ---- input-bound -----------------------------------------------------------------------------

def test_input_bound_judged_by_the_jobs_own_cpu():
    ranks = [rank(0, data_wait=30.0), rank(1, data_wait=24.0)]
    f = only(input_bound(window(ranks=ranks, nodes=[node(cpu_busy=0.97, job_cpu=1.9, cpus=2)]), TH))
    assert f.lost_share == pytest.approx(24 / 120) and f.severity == "critical"   # what every rank pays
    assert f.lost_s == pytest.approx(0.2 * 240)
    assert "used 1.90 of 2 CPUs (95.0%)" in f.seen and "starved" in f.action and f.evidence["worst_rank"] == "0"
    f = only(input_bound(window(ranks=ranks, nodes=[node(cpu_busy=0.3, job_cpu=0.6, cpus=2)]), TH))
    assert "CPUs left for the loader" in f.seen and f.action == MORE_WORKERS
    assert input_bound(window(ranks=[rank(0, data_wait=0.5)]), TH) == []


def test_other_processes_cpu_never_flips_the_input_advice():
    """The loader sleeps and the job uses a third of a core; other processes keep the host 95%, 81% or 20%
    busy: the same advice every time (the host's CPU was judged before: fewer workers at 95%, more at 81%)."""
    ranks = [rank(0, data_wait=60.0)]
    advice = set()
    for host in (0.95, 0.81, 0.2):
        f = only(input_bound(window(ranks=ranks, nodes=[node(cpu_busy=host, job_cpu=0.33, cpus=2)]), TH))
        advice.add(f.action)
        assert "0.33 of 2 CPUs" in f.seen and f.evidence["job_cpu_share_max"] == pytest.approx(0.165)
        assert ("the rest other processes'" in f.seen) == (host >= 0.365), f.seen
    assert advice == {MORE_WORKERS}
    # several nodes: the node where the job uses the largest share of the CPUs is judged
    f = only(input_bound(window(ranks=ranks, nodes=[node("n0", cpu_busy=0.2, job_cpu=3.8, cpus=4),
                                                    node("n1", cpu_busy=0.99, job_cpu=0.2, cpus=4)]), TH))
    assert "on n0" in f.seen and "starved" in f.action


def test_input_cpu_not_checked_without_the_jobs_processes():
    ranks = [rank(0, data_wait=60.0)]
    for nodes in ([node(cpu_busy=0.95)], [node(cpu_busy=0.1)], []):   # host CPU only, or nothing
        f = only(input_bound(window(ranks=ranks, nodes=nodes), TH))
        assert "the job's CPU use not checked" in f.seen and "starved" not in f.action
        assert f.action.startswith(MORE_WORKERS) and "not checked" in f.action and f.evidence["job_cpu_share_max"] is None


def test_one_slow_loader_is_not_input_bound_for_the_job():
    # rank 1 waits 30 s for data, rank 0 none: rank 0 waits for rank 1 in collectives instead (a straggler)
    ranks = [rank(0, data_wait=0.0, forward=30.0, waits={"backward": 30.0}), rank(1, data_wait=30.0, forward=30.0, waits={})]
    assert input_bound(window(ranks=ranks), TH) == []
    f = only(straggler(window(ranks=ranks), TH))
    assert f.where["ranks"] == ["1"] and f.evidence["phase"] == "data_wait" and "input" in f.title


def test_input_rule_says_when_no_data_wait_is_measured():
    f = only(input_bound(window(ranks=[rank(0, forward=30.0)]), TH))
    assert f.severity == "info" and f.missing == ["data-wait phase"] and "not checked" in f.title


# ---- stragglers ------------------------------------------------------------------------------

def test_straggler_named_from_measured_waits():
    # phase seconds are own time: the 10 s rank 0 waits inside backward are not in its backward phase
    fast = rank(0, host="n0", forward=30.0, backward=50.0, optimizer=10.0, waits={"backward": 10.0})
    slow = rank(1, host="n1", forward=40.0, backward=50.0, optimizer=10.0, waits={})   # 0.1 s more per step
    w = window(ranks=[fast, slow], gpus=[gpu(0, host="n0"), gpu(1, host="n1", clock_hz=1.6e9)],
               nodes=[node("n0"), node("n1", ib_errors=12.0)])
    f = only(straggler(w, TH))
    assert f.where == {"ranks": ["1"], "nodes": ["n1"]}
    assert f.evidence["lateness_s"] == pytest.approx(0.1) and f.evidence["phase"] == "forward"
    assert f.evidence["per_rank"]["0"]["collective_wait_s"] == pytest.approx(0.1)
    causes = " ".join(f.evidence["candidate_causes"])
    assert "n1/gpu1 SM clock 1600 MHz" in causes and "12 InfiniBand port errors on n1" in causes
    assert f.lost_s == pytest.approx(0.1 * 100 * 1)


def test_unphased_time_on_one_rank_is_not_blamed_on_the_rank_that_waits():
    # rank 1 spends 0.2 s per step outside any phase; rank 0 waits for it in the forward all-gather,
    # so rank 0's forward step section is the longer one: phase positions would name rank 0
    waiting = rank(0, forward=30.0, backward=30.0, waits={"forward": 20.0}, step_s=0.8)
    late = rank(1, forward=30.0, backward=30.0, waits={}, step_s=0.8)
    f = only(straggler(window(ranks=[waiting, late]), TH))
    assert f.where["ranks"] == ["1"] and f.evidence["phase"] == "unphased"
    assert f.evidence["lateness_s"] == pytest.approx(0.2)


def test_no_straggler_when_ranks_agree():
    ranks = [rank(i, forward=30.0, backward=60.0, waits={"backward": 5.0}) for i in range(4)]
    assert straggler(window(ranks=ranks), TH) == []
    assert straggler(window(ranks=ranks[:1]), TH) == []


def test_straggler_not_checked_without_collective_wait():
    ranks = [rank(0, forward=30.0), rank(1, forward=40.0)]
    f = only(straggler(window(ranks=ranks), TH))
    assert f.severity == "info" and f.missing == ["collective-wait metric"] and "not checked" in f.title


def test_a_difference_that_moves_between_ranks_is_noise():
    ranks = [rank(0, forward=30.0, waits={"backward": 10.0}), rank(1, forward=40.0, waits={})]
    w = window(ranks=ranks)
    w.busy = {"0": [0.9, 1.0, 0.8, 1.0, 0.85, 1.0], "1": [1.0, 0.9, 1.0, 0.9, 1.0, 0.95]}   # rank 1 busiest 3 of 6
    f = only(straggler(w, TH))
    assert f.severity == "info" and "no consistent straggler" in f.title and f.evidence["consistency"] == 0.5
    w.busy = {"0": [0.9] * 6, "1": [1.0] * 6}
    f = only(straggler(w, TH))
    assert f.severity != "info" and f.evidence["consistency"] == 1.0 and f.confidence == "high"


def test_unsynchronised_slow_rank_is_busier():
    ranks = [rank(0, step_s=1.0, forward=100.0, waits={}), rank(1, step_s=1.5, forward=100.0, waits={})]
    f = only(straggler(window(ranks=ranks), TH))
    assert f.where["ranks"] == ["1"] and f.evidence["phase"] == "unphased"


# ---- periodic stalls -------------------------------------------------------------------------

def _stalls(phase: str | None, every: int = 6, duration: float = 300.0):
    t = grid(duration)
    drop = [i % every in (3, 4) for i in range(len(t))]
    series = {"sm": [0.05 if d else 0.6 for d in drop]}
    if phase:
        series[f"phase_{phase}"] = [2.0 if d else 0.0 for d in drop]
    return window(ranks=[rank(0), rank(1)], gpus=[gpu(0), gpu(1)], timeline=Timeline(t=t, series=series),
                  duration=duration)


def test_periodic_stalls_period_and_phase_match():
    f = only(periodic_stalls(_stalls("checkpoint"), TH))
    assert f.evidence["period_s"] == pytest.approx(30.0) and f.evidence["matched_phase"] == "checkpoint"
    assert f.severity == "info" and f.lost_s == 0 and "matching checkpoints" in f.title
    f = only(periodic_stalls(_stalls(None), TH))
    assert f.evidence["matched_phase"] is None and f.lost_s > 0 and f.severity != "info"
    assert "gc.freeze" in f.action


def test_a_window_starting_in_a_checkpoint_still_names_checkpoints():
    """The first drop is a checkpoint's tail (its phase fell before the window); the loader waits
    one grid point after every checkpoint. Every drop touches data_wait at its edge, 10 of 11 touch
    the checkpoint phase, but the drops' time is the checkpoints'."""
    t = grid(300.0)
    first = {0}
    ckpt = {i for i in range(len(t)) if i % 6 in (3, 4)}
    series = {"sm": [0.05 if i in first | ckpt else 0.6 for i in range(len(t))],
              "phase_checkpoint": [2.0 if i in ckpt else 0.0 for i in range(len(t))],
              "phase_data_wait": [1.0 if i % 6 == 5 or i == 1 else 0.0 for i in range(len(t))]}
    w = window(ranks=[rank(0), rank(1)], gpus=[gpu(0), gpu(1)], timeline=Timeline(t=t, series=series),
               duration=300.0)
    f = only(periodic_stalls(w, TH))
    assert f.evidence["matched_phase"] == "checkpoint" and "matching checkpoints" in f.title
    assert f.evidence["match_share"] == pytest.approx(10 / 11, abs=1e-3) and f.evidence["drop_time_in_phase"] >= 0.9
    assert f.severity == "info" and f.lost_s == 0


def test_irregular_drops_are_not_periodic():
    w = _stalls(None)
    sm = w.timeline.series["sm"] = [0.6] * len(w.timeline.t)
    for start in (3, 8, 20, 23, 40, 55):          # gaps of 5, 12, 3, 17, 15 grid steps
        sm[start] = sm[start + 1] = 0.05
    assert periodic_stalls(w, TH) == []


# ---- communication (profiles) -----------------------------------------------------------------

def _profile(comm: float, compute: float, idle: float = 50.0):
    ns = 1e9
    return from_samples([
        (["all_gather_into_tensor", "_all_gather_params", "fetch_sub_module", "forward", "main"], comm * ns, {"phase": "forward"}, {"rank": "0"}),
        (["matmul", "forward", "main"], compute * ns, {"phase": "forward"}, {"rank": "0"}),
        (["wait", "run", "_bootstrap"], idle * ns, {}, {"rank": "0"}),   # an idle helper thread: left out
    ])


def test_comm_bound_from_profiles_alone_says_its_basis():
    p = _profile(comm=60.0, compute=40.0)
    assert p.training_s == pytest.approx(100.0) and p.comm_share() == pytest.approx(0.6)
    slow_link = window(ranks=[rank(0)], nodes=[node(link_Bps=6e9, link_limit_Bps=25e9, link_kind="infiniband")])
    slow_link.profile = p
    f = only(comm_bound(slow_link, TH))
    assert f.severity == "critical" and "ZeRO-3" in f.title and f.confidence == "low"
    assert "not measured" in f.seen and "includes waits caused by stragglers" in f.basis
    assert f.evidence["bound"] == "latency" and f.tune_space == LATENCY_SPACE
    assert "otel-gpu tune" in f.action and "6.0 GB/s of 25.0 GB/s" in f.seen
    busy_link = window(ranks=[rank(0)], nodes=[node(link_Bps=23e9, link_limit_Bps=25e9, link_kind="infiniband")])
    busy_link.profile = p
    assert only(comm_bound(busy_link, TH)).tune_space == BANDWIDTH_SPACE


def test_comm_bound_from_measured_waits_counts_only_what_every_rank_waits():
    # both ranks wait 0.25 s per 1 s step (1.2 s of wall time per step); rank 0 waits 0.2 s more for a
    # straggler: not communication's
    ranks = [rank(0, forward=30.0, waits={"forward": 45.0}), rank(1, forward=50.0, waits={"forward": 25.0})]
    f = only(comm_bound(window(ranks=ranks), TH))
    assert f.evidence["wait_share"] == pytest.approx(25 / 120, abs=1e-4) and f.severity == "warning"
    assert f.lost_s == pytest.approx(0.25 * 100 * 2) and "least collective wait" in f.basis
    assert f.evidence["profile_source"] is None and "profiles not read" in f.seen
    quiet = [rank(0, waits={"backward": 5.0}), rank(1, waits={"backward": 5.0})]
    assert comm_bound(window(ranks=quiet), TH) == []


def test_comm_wait_on_a_node_other_processes_keep_busy_is_info_naming_them():
    """A clean job on an overloaded node: descheduled ranks wait for each other in collectives. The
    wait is said, with the contention, as info; the job's own CPU use alone does not count."""
    ranks = [rank(i, forward=50.0, waits={"forward": 30.0}) for i in range(2)]
    crowded = window(ranks=ranks, nodes=[node(cpu_busy=0.98, job_cpu=1.1, cpus=2.0)])
    f = only(comm_bound(crowded, TH))
    assert f.severity == "info" and f.confidence == "low" and "other processes" in f.title
    assert "43.0% of them other processes'" in f.seen and f.action.startswith("free the node's CPUs")
    own = window(ranks=ranks, nodes=[node(cpu_busy=0.98, job_cpu=1.9, cpus=2.0)])   # the job itself is busy
    unread = window(ranks=ranks, nodes=[node(cpu_busy=0.98, cpus=2.0)])             # its own CPU not read
    for w in (own, unread):
        f = only(comm_bound(w, TH))
        assert f.severity == "warning" and f.evidence["cpu_contention"] is None


def test_comm_rule_says_what_is_missing():
    f = only(comm_bound(window(ranks=[rank(0)]), TH))
    assert f.missing == ["collective-wait metric", "profiles"]
    w = window(ranks=[rank(0)])
    w.profile_error = "Pyroscope at http://p:4040 is unreachable: connection refused"
    assert only(comm_bound(w, TH)).missing == ["collective-wait metric", w.profile_error]
    w = window(ranks=[rank(0)])
    w.profile = _profile(comm=5.0, compute=95.0)
    assert comm_bound(w, TH) == []
    w.profile = _profile(comm=60.0, compute=40.0)
    assert only(comm_bound(w, TH)).evidence["bound"] == "unknown"


# ---- all rules together ----------------------------------------------------------------------

def test_clean_window_has_nothing_above_info():
    t = grid()
    tl = Timeline(t=t, series={"sm": [0.62] * len(t), "util": [0.9] * len(t), "steps": [1.0] * len(t)})
    ranks = [rank(i, host=f"n{i // 2}", data_wait=1.0, forward=40.0, backward=60.0, optimizer=15.0) for i in range(4)]
    w = window(ranks=ranks, gpus=[gpu(i, host=f"n{i // 2}") for i in range(4)], nodes=[node("n0"), node("n1")], timeline=tl)
    w.profile = _profile(comm=5.0, compute=95.0)
    found = run_rules(w, TH)
    assert all(f.severity == "info" for f in found), [(f.severity, f.title) for f in found]
    assert len(RULES) >= 9


def test_ranking_by_time_at_stake_missing_last():
    mk = lambda lost, sev="warning", missing=(): Finding("r", "t", sev, "high", "s", "w", "a", lost_s=lost, missing=list(missing))
    ranked = rank_findings([mk(5), mk(0, "info", ["x"]), mk(50), mk(0, "critical")])
    assert [f.lost_s for f in ranked] == [50, 5, 0, 0]
    assert ranked[2].severity == "critical" and ranked[3].missing == ["x"]
    with pytest.raises(ValueError):
        mk(1, "urgent")


def test_tune_spaces_are_valid_space_files():
    space = pytest.importorskip("otel_gpu.tune.space", reason="otel_gpu.tune not available")
    for doc in (LATENCY_SPACE, BANDWIDTH_SPACE):
        parsed = space.parse_space(doc, where="diagnose")
        assert "sub_group_size" not in parsed.names()
    assert space.parse_space(LATENCY_SPACE).by_name("reduce_bucket_size").low == 50_000_000


def test_phase_occupancy_from_cumulative_seconds():
    from otel_gpu.diagnose.window import occupancy

    # 2 ranks, 1 s grid: a 3 s phase on both ranks ends at point 5 (6 s counted), 0.5 s more at point 8
    cum = [None, None, 0.0, 0.0, 0.0, 6.0, 6.0, 6.0, 6.5, None, 6.5]
    assert occupancy(cum, 1.0, 2) == [0, 0, 0, 2.0, 2.0, 2.0, 0, 0, 0.5, 0, 0]
    # present at the window start: what was counted before it is not laid into the window
    assert occupancy([100.0, 100.0, 101.0], 1.0, 1) == [0, 0, 1.0]
    # a series first seen inside the window: its first value happened just before
    assert occupancy([None, None, 1.5], 1.0, 1) == [0, 0.5, 1.0]


def test_the_exporter_threads_http_send_is_not_communication():
    ns = 1e9
    p = from_samples([
        (["send", "Session.send", "post", "_export", "export", "_receive_metrics", "_ticker", "run"], 30 * ns, {}, {"rank": "0"}),
        (["all_reduce", "backward", "main"], 10 * ns, {"phase": "backward"}, {"rank": "0"}),
        (["matmul", "forward", "main"], 60 * ns, {"phase": "forward"}, {"rank": "0"}),
    ])
    assert p.training_s == pytest.approx(70.0) and p.comm_share() == pytest.approx(10 / 70)


def test_save_pairs_from_latest_start_and_end_times():
    from otel_gpu.diagnose.parse import pair_saves

    # three saves seen; an end from before the window and a start with no end yet are left out
    starts, ends = {5.0, 100.0, 200.0, 300.0, 390.0}, {8.0, 110.0, 205.0, 330.0}
    assert pair_saves(starts, ends, 50.0, 400.0) == [(100.0, 110.0), (200.0, 205.0), (300.0, 330.0)]
    assert pair_saves(set(), ends, 0.0, 400.0) == []


@settings(max_examples=200, deadline=None)
@given(st.sets(st.floats(allow_nan=True, allow_infinity=True, width=32)),
       st.sets(st.floats(allow_nan=True, allow_infinity=True, width=32)),
       st.floats(-1e6, 1e6), st.floats(0, 1e6))
def test_save_pairs_are_ordered_real_saves(starts, ends, start, length):
    from otel_gpu.diagnose.parse import pair_saves

    pairs = pair_saves(starts, ends, start, start + length)
    assert len(pairs) <= len(ends)
    assert [e for _, e in pairs] == sorted({e for _, e in pairs})          # one pair per distinct end, in order
    for b, e in pairs:
        assert b in starts and e in ends and b <= e and e >= start and b <= start + length
