"""Tensor pipes, GPM readings missing, GPU words on CPU-only windows, not-checked findings and advice
that depends on what already ran: pure rules over hand-built windows."""
from __future__ import annotations

from otel_gpu.diagnose import Report, run_rules
from otel_gpu.diagnose import report as R
from otel_gpu.diagnose.findings import missing_input
from otel_gpu.diagnose.rules_gpu import sm_idle, throttling
from otel_gpu.diagnose.rules_train import input_bound
from otel_gpu.diagnose.tensor import tensor_idle
from otel_gpu.diagnose.thresholds import Thresholds

from .windows import gpu, node, rank, window

TH = Thresholds()


def test_bf16_run_with_busy_sms_and_idle_tensor_pipes_is_reported_with_what_it_can_mean():
    # the observed plain GPT-2 run: 95% utilization, 86% SM activity, 12% tensor activity
    gpus = [gpu(i, util=0.95, sm=0.86, tensor=0.12, dram=0.35, occupancy=0.4) for i in range(2)]
    [f] = tensor_idle(window(ranks=[rank(0), rank(1)], gpus=gpus), TH)
    assert f.rule == "tensor" and f.severity == "info" and not f.missing
    assert "12.0%" in f.title and "86.0%" in f.title
    assert "utilization 95.0%" in f.seen and "DRAM bandwidth 35.0%" in f.seen and "SM occupancy 40.0%" in f.seen
    assert "TF32" in f.why and "elementwise" in f.why and "memory-bound" not in f.why
    assert "autocast" in f.action and "trace analyze" in f.action
    assert f.lost_s == 0 and "no time estimate" in f.basis
    assert f.evidence["tensor_activity"] == 0.12 and f.evidence["sm_occupancy"] == 0.4
    assert f.where["gpus"] == ["n0/gpu0", "n0/gpu1"]


def test_fp32_without_tf32_is_a_warning_and_high_dram_names_memory_bound_kernels():
    [f] = tensor_idle(window(gpus=[gpu(0, sm=0.9, tensor=0.01, dram=0.8)]), TH)
    assert f.severity == "warning" and "memory-bound" in f.why


def test_tensor_rule_quiet_where_nothing_can_be_done_and_without_gpm():
    assert tensor_idle(window(gpus=[gpu(0, sm=0.8, tensor=0.6)]), TH) == []      # tensor pipes busy
    assert tensor_idle(window(gpus=[gpu(0, sm=0.2, tensor=0.0)]), TH) == []      # GPU mostly idle: other rules
    assert tensor_idle(window(), TH) == []                                          # no GPUs: sm_idle says so
    assert tensor_idle(window(gpus=[gpu(0, sm=None, tensor=None)]), TH) == []      # no GPM: sm_idle's card says so
    [f] = sm_idle(window(gpus=[gpu(0, sm=None, tensor=None)]), TH)
    assert f.missing and "Hopper" in f.why + f.action and f.confidence == ""
    assert tensor_idle(window(gpus=[gpu(0, sm=0.9, tensor=0.2)]), Thresholds({"tensor": {"info_max": 0.1}})) == []


def test_not_checked_carries_no_confidence_in_any_rendering():
    f = missing_input("x", "Something", "do this", ["input"])
    assert f.confidence == "" and f.as_dict()["confidence"] == ""
    w = window(ranks=[rank(0)])
    rep = Report(w, [f], {"queries": 1, "query_seconds": 0.1})
    text = R.text(rep.as_dict())
    assert "not checked" in text and "confidence" not in text


def test_cpu_only_window_has_no_gpu_words():
    ranks = [rank(i, data_wait=40) for i in range(2)]
    w = window(ranks=ranks, nodes=[node()])
    w.source, w.agent = "recording", True   # `otel-gpu run` started the agent, which saw no GPU
    found = run_rules(w)
    d = Report(w, found, {"source": "recording", "dirs": ["r"]}).as_dict()
    out = R.text(d) + R.markdown(d)
    assert "GPU-s" not in out and "GPU-min" not in out and "rank-" in out
    f = next(x for x in found if x.rule == "input")
    assert "a rank computes nothing" in f.why and "GPU" not in f.why
    notes = [x for x in found if x.missing and "GPU" in x.missing[0]]
    assert len(notes) == 1 and notes[0].title == "GPU counters: not checked (no GPU metrics)"
    assert "agent ran" in notes[0].action and "run the otel-gpu agent" not in out


def test_advice_never_asks_for_what_already_ran():
    ranks = [rank(0, forward=30)]
    recorded = window(ranks=ranks)
    recorded.source, recorded.agent = "recording", False   # recorded with --no-agent
    assert "--no-agent" in sm_idle(recorded, TH)[0].action
    f = input_bound(recorded, TH)[0]
    assert f.missing and "do not come from a torch DataLoader" in f.action and "under `otel-gpu run`" not in f.action
    served = window(ranks=ranks)   # Prometheus: nothing known about what ran
    assert "run the otel-gpu agent" in sm_idle(served, TH)[0].action and len(throttling(served, TH)) == 1
    assert "`otel-gpu run`" in input_bound(served, TH)[0].action
    with_loader = window(ranks=[rank(0, data_wait=30)])
    with_loader.source, with_loader.agent = "recording", True
    f = input_bound(with_loader, TH)[0]
    assert "the job's CPU use not checked" in f.seen and "agent" not in f.action
