"""Evidence reasons, direction wording, noise, the winner's explanation, the queue of first trials,
the example's device choice and the node-agent flags: pure parts, fast."""
from __future__ import annotations

import itertools
import re
import runpy
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.tune import evidence as E
from otel_gpu.tune import explain
from otel_gpu.tune.report import Row, baseline_time, fmt_change, fmt_seconds, fmt_value, noise
from otel_gpu.tune.sampler import BASELINE, REPEAT, SEED, baseline_repeats, queued_trials
from otel_gpu.tune.space import Space

from .helpers import EXAMPLE, copy_base

times = st.floats(min_value=1e-4, max_value=1e3, allow_nan=False)


@given(t=times, base=times)
@settings(max_examples=300, deadline=None)
def test_every_change_says_its_direction_and_agrees_with_its_ratio(t, base):
    text = fmt_change(t / base - 1)
    m = re.fullmatch(r"([+-]\d+\.\d)% \((?:(\d+\.\d\d)x (faster|slower)|same speed)\)", text)
    assert m, text
    if m.group(3) == "faster":
        assert t < base and text.startswith("-")
        assert float(m.group(2)) == pytest.approx(base / t, rel=0.01, abs=0.006)
    elif m.group(3) == "slower":
        assert t > base and text.startswith("+")
        assert float(m.group(2)) == pytest.approx(t / base, rel=0.01, abs=0.006)
    else:
        assert abs(t / base - 1) < 0.0005


def test_the_issue_s_numbers_read_as_a_speed_up():
    assert fmt_change(115.9 / 160.7 - 1) == "-27.9% (1.39x faster)"
    assert fmt_change(0.12) == "+12.0% (1.12x slower)"


def _row(n, t, role="sampled", repeat=0, evidence=None, params=None):
    return Row(n, role, "ok", "", t, 10.0, params or {"overlap_comm": n > 0}, evidence or {}, repeat=repeat)


def test_noise_is_the_spread_of_the_baseline_runs_or_says_it_was_not_measured():
    one = [_row(0, 0.160, BASELINE), _row(1, 0.116)]
    spread, text = noise(one)
    assert spread is None and text.startswith("noise not measured: only 1 baseline run")
    two = one + [_row(2, 0.164, BASELINE, repeat=1)]
    spread, text = noise(two)
    assert spread == pytest.approx(0.004 / 0.162) and "differ by 2.5%" in text
    assert baseline_time(two) == pytest.approx(0.162)


def test_the_winner_is_explained_with_what_moved_its_basis_and_how_sure():
    base_ev = {"sm_activity": 0.21, "gpu_utilization": 0.99, "gpu_memory_peak_bytes": 40 * 2**30,
               E.COLLECTIVES: {"all_gather": 0.050, "reduce_scatter": 0.020}, E.BASIS: "gpu",
               E.NOT_CHECKED: {"nvlink_bytes_per_s": "not checked: no NVLink readings (x)"}}
    win_ev = {"sm_activity": 0.34, "gpu_utilization": 0.99, "gpu_memory_peak_bytes": 42 * 2**30,
              E.COLLECTIVES: {"all_gather": 0.020, "reduce_scatter": 0.012}, E.BASIS: "gpu", E.WINDOW: 30.0,
              E.NOT_CHECKED: {"nvlink_bytes_per_s": "not checked: no NVLink readings (x)"}}
    runs = [_row(0, 0.1590, BASELINE, evidence=base_ev, params={"overlap_comm": False}),
            _row(4, 0.1624, BASELINE, repeat=1, evidence=base_ev, params={"overlap_comm": False})]
    top = _row(6, 0.1159, evidence=win_ev, params={"overlap_comm": True})
    spread, _ = noise(runs)
    text = "\n".join(explain.winner_section(runs, top, baseline_time(runs), spread, {"overlap_comm": False},
                                            fmt_value, fmt_seconds, fmt_change))
    assert "**step time -27.9% (1.39x faster)**" in text and "mean of 2 runs" in text
    assert "differ by 2.1%" in text and "beyond the noise" in text
    assert "| overlap_comm | false | true |" in text
    assert "| SM activity | 21% | 34% | +13.0 points | GPM SM activity" in text
    assert "| all_gather time per step | 50.00 ms | 20.00 ms | -60.0% | GPU-timed" in text
    assert "Collective time per step: 70.00 -> 32.00 ms" in text and "of the time saved" in text
    assert "| NVLink GiB/s | n/a | n/a | - | not checked: no NVLink readings (x) |" in text


def test_a_change_within_the_noise_is_called_so():
    assert "within or near the noise" in explain.confidence(-0.01, 0.02, 2)
    assert explain.confidence(-0.3, None, 1).startswith("How sure: not measured: 1 baseline run")


@pytest.mark.parametrize("seen, note, key, expected", [
    ({}, None, "sm_activity", "not checked: no node agent readings in the window"),
    ({"agent": True}, "NVIDIA driver not found (libnvidia-ml.so.1): GPU metrics are off", "gpu_utilization",
     "not checked: no GPU (NVIDIA driver not found (libnvidia-ml.so.1): GPU metrics are off)"),
    ({"agent": True, "gpu": True}, None, "tensor_activity", "not checked: no GPM readings (NVIDIA Hopper or newer, not MIG)"),
    ({"agent": True, "gpu": True}, None, "ib_bytes_per_s", "not checked: no InfiniBand port on this node"),
    ({"agent": True, "recorded": {"cpu_busy"}}, None, "cpu_busy",
     "not checked: too few readings inside the 0.4 s steady window (the node agent reads once a second by default)"),
])
def test_every_missing_reading_says_why(seen, note, key, expected):
    assert E.reasons({E.WINDOW: 0.4}, seen, note)[key] == expected


def test_collective_time_missing_names_the_flight_recorder_reason():
    assert E.reasons({}, {"unmeasured": ["max_connections_1"]}, None)[E.COLLECTIVES] == "not measured: max_connections_1"


def test_prometheus_evidence_queries_fill_every_placeholder():
    for q in [*E.PROM.values(), E.COLLECTIVE_QUERY, *E.PROM_SEEN.values()]:
        text = E.prom_render(q, 'host_name="a"', 'otelgpu_trial="t-1"', "30s")
        assert "{" + "sel" not in text and "{w}" not in text and "{trial" not in text
        assert "[30s]" in text or "offset 30s" in text, text


@given(trials=st.integers(1, 100), seeds=st.integers(0, 8), runs=st.integers(1, 10))
def test_baseline_repeats_always_leave_two_sampled_trials(trials, seeds, runs):
    extra = baseline_repeats(trials, seeds, runs)
    assert 0 <= extra <= runs - 1
    assert extra == 0 or trials - (1 + seeds + extra) >= 2


def test_queue_is_baseline_then_known_good_then_the_repeat():
    space = Space()
    base = {p.name: v for p, v in zip(space.params, [False, True, 10**9, 4096, 3686, 640, 10**9, 10**9])}
    queue = queued_trials(space, base, trials=10, runs=2)
    roles = [(a["role"], a.get(REPEAT)) for _, a in queue]
    assert roles[0] == (BASELINE, None) and roles[-1] == (BASELINE, 1)
    assert all(r == (SEED, None) for r in roles[1:-1]) and len(roles) == 5
    assert queue[0][0] == queue[-1][0] == base
    assert [a.get(REPEAT) for _, a in queued_trials(space, base, trials=5, runs=2)].count(1) == 0


def test_example_device_choice_is_exhaustive_and_refuses_contradictions():
    ns = runpy.run_path(str(EXAMPLE), run_name="example")
    choose = ns["choose_device"]
    for requested, accel, cuda in itertools.product(("auto", "cpu", "cuda"), (None, "", "cpu", "cuda", "xpu"), (False, True)):
        try:
            device = choose(requested, accel, cuda)
        except ValueError as exc:
            assert accel == "xpu" or (requested != "auto" and accel and accel != requested) or \
                ("cuda" in (requested, accel) and not cuda), (requested, accel, cuda, exc)
            continue
        assert device in ("cpu", "cuda") and (device == "cpu" or cuda)
        if requested != "auto":
            assert device == requested
        elif accel:
            assert device == accel
        else:
            assert device == ("cuda" if cuda else "cpu")


@pytest.mark.parametrize("extra, message", [
    (["--node-agent", "--no-instrument"], "--node-agent: its readings would go nowhere"),
    (["--no-node-agent", "--node-agent-arg=--no-gpu"], "--node-agent-arg needs a node agent"),
    (["--node-agent-arg=--interval=0"], "--node-agent-arg: --interval='0': must be between 0.1 and 3600"),
    (["--baseline-runs", "0"], "argument --baseline-runs: '0': must be between 1 and 10"),
    (["--baseline-runs", "11"], "argument --baseline-runs: '11': must be between 1 and 10"),
])
def test_node_agent_and_baseline_flags_are_checked_first(tmp_path, capsys, extra, message):
    base = copy_base(tmp_path)
    argv = ["tune", "--base-config", str(base), "--command", "x {config}", "--out", str(tmp_path / "o"),
            "--hidden-size", "64", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_mean_evidence_of_baseline_runs():
    runs = [SimpleNamespace(evidence={"sm_activity": 0.2, E.COLLECTIVES: {"all_gather": 0.01}}),
            SimpleNamespace(evidence={"sm_activity": 0.4, E.COLLECTIVES: {"all_gather": 0.03}}),
            SimpleNamespace(evidence={})]
    ev = explain.mean_evidence(runs)
    assert ev["sm_activity"] == pytest.approx(0.3) and ev[E.COLLECTIVES] == {"all_gather": pytest.approx(0.02)}
    assert ev["cpu_busy"] is None


def test_counts_in_human_output_take_the_right_number():
    from otel_gpu.tune import config as C
    from otel_gpu.tune.objective import StepStats
    from otel_gpu.tune.report import not_checked_lines

    why = {E.NOT_CHECKED: {"sm_activity": "not checked: no GPU"}}
    assert not_checked_lines([_row(3, 0.1, evidence=why)]) == ["- SM activity: n/a in trial 3: not checked: no GPU"]
    assert not_checked_lines([_row(0, 0.1, evidence=why), _row(1, 0.1, evidence=why)]) == \
        ["- SM activity: n/a in trials 0-1: not checked: no GPU"]
    assert StepStats(0.1, 1, 4, 1).problem(5) == "1 step after warm-up, 5 needed (4 seen)"
    assert StepStats(None, 0, 3, 0, expected_ranks=1).problem(1) == "only 0 of 1 rank reported steps"
    batch = {"train_batch_size": 3, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
    assert any("micro batches of 2 on 1 rank (" in r for r in C.validate({"zero_optimization": {"stage": 3}, **batch}, 1))
    assert explain.confidence(-0.3, None, 1).startswith("How sure: not measured: 1 baseline run completed")
    assert "mean of 2 runs" in explain.winner_section(
        [_row(0, 0.2, BASELINE), _row(1, 0.2, BASELINE, repeat=1)], _row(2, 0.1), 0.2, 0.0, {}, str, str, str)[2]
