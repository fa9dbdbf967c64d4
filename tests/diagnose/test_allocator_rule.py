"""The allocator rule and the memory rule's advice over hand-built windows; GC pauses as a straggler's
cause; the PromQL parts of both parsed back (pure, no server)."""
from __future__ import annotations

import pytest

from otel_gpu.diagnose import Thresholds, run_rules
from otel_gpu.diagnose.allocator import FIX, allocator, memory_advice
from otel_gpu.diagnose.health import health_inputs, health_parts
from otel_gpu.diagnose.model import AllocatorWindow
from otel_gpu.diagnose.queries import selector
from otel_gpu.diagnose.rules_gpu import memory_pressure
from otel_gpu.diagnose.straggler import straggler

from .windows import gpu, rank, window

TH = Thresholds()
GIB = 1 << 30


def with_alloc(r, **devices):
    r.alloc = {d.removeprefix("cuda"): a for d, a in devices.items()}
    return r


def test_retries_per_step_named_with_the_fix():
    r0 = with_alloc(rank(0), cuda0=AllocatorWindow(retries=0, ooms=0, reserved_max_b=60 * GIB, reserved_mean_b=50 * GIB,
                                                   allocated_max_b=55 * GIB, inactive_mean_b=1 * GIB))
    r1 = with_alloc(rank(1), cuda0=AllocatorWindow(retries=46, ooms=0, reserved_max_b=79 * GIB, reserved_mean_b=70 * GIB,
                                                   allocated_max_b=70 * GIB, inactive_mean_b=6 * GIB))
    (f,) = allocator(window([r0, r1], [gpu(0), gpu(1)]), TH)
    assert f.severity == "critical" and f.where["ranks"] == ["1"]   # 0.46 retries per step >= 0.05
    assert f.evidence["retries_per_step"] == pytest.approx(0.46)
    assert "46 retries over 100 steps" in f.seen and "expandable_segments:True" in f.action
    assert f.evidence["per_device"]["rank 1 cuda:0"]["fragmentation"] == pytest.approx(6 / 70, abs=1e-4)
    rare = with_alloc(rank(1), cuda0=AllocatorWindow(retries=2, ooms=0))
    (g,) = allocator(window([r0, rare], [gpu(0)]), TH)
    assert g.severity == "warning" and "2 allocation retries" in g.title


def test_fragmentation_without_retries_and_nothing_when_healthy():
    frag = with_alloc(rank(0), cuda0=AllocatorWindow(retries=0, ooms=0, reserved_max_b=40 * GIB,
                                                     reserved_mean_b=30 * GIB, inactive_mean_b=12 * GIB))
    (f,) = allocator(window([frag], [gpu(0)]), TH)
    assert f.severity == "warning" and "fragmentation 40.0%" in f.title and f.action == FIX
    small = with_alloc(rank(0), cuda0=AllocatorWindow(retries=0, ooms=0, reserved_mean_b=0.5 * GIB, inactive_mean_b=0.4 * GIB))
    assert allocator(window([small], [gpu(0)]), TH) == []   # under 1 GiB reserved: not judged
    healthy = with_alloc(rank(0), cuda0=AllocatorWindow(retries=0, ooms=0, reserved_mean_b=30 * GIB, inactive_mean_b=1 * GIB))
    assert allocator(window([healthy], [gpu(0)]), TH) == []


def test_not_checked_without_allocator_series_on_a_gpu_job_only():
    (f,) = allocator(window([rank(0)], [gpu(0)]), TH)
    assert f.missing and "not checked" in f.title
    assert allocator(window([rank(0)]), TH) == []   # a CPU job: nothing to say
    assert allocator(window([], [gpu(0)]), TH) == []   # GPUs without training ranks (--gpu-only): nothing either


def test_memory_rule_advises_expandable_segments_only_on_allocator_evidence():
    full = gpu(0, mem_used_b=79e9, mem_limit_b=80e9)
    (f,) = memory_pressure(window([rank(0)], [full]), TH)
    assert "expandable_segments" not in f.action and "allocator not checked" in f.action
    assert f.evidence["allocator"] == "not checked"
    retrying = with_alloc(rank(0), cuda0=AllocatorWindow(retries=5, ooms=0))
    (g,) = memory_pressure(window([retrying], [full]), TH)
    assert "expandable_segments:True" in g.action and g.evidence["allocator"]["retries"] == 5
    calm = with_alloc(rank(0), cuda0=AllocatorWindow(retries=0, ooms=0, reserved_mean_b=70 * GIB, inactive_mean_b=2 * GIB))
    (h,) = memory_pressure(window([calm], [full]), TH)
    assert "expandable_segments" not in h.action and "would not help" in h.action
    assert memory_advice(window([calm], [full]), TH)[1]["allocator"]["fragmentation_max"] == pytest.approx(2 / 70, abs=1e-4)


def test_gc_pauses_name_the_straggler_and_lead_its_action():
    # rank 1 is busy 40 ms longer per step; 35 ms of it in full collections (its own GC clock)
    r0 = rank(0, step_s=0.2, waits={"backward": 0.045 * 100}, forward=5.0, backward=8.0)
    r1 = rank(1, step_s=0.2, waits={"backward": 0.005 * 100}, forward=5.0, backward=8.0)
    r0.gc_s, r0.gc_n = {"0": 0.05, "1": 0.01, "2": 0.0}, {"0": 100, "1": 10, "2": 0}
    r1.gc_s, r1.gc_n = {"0": 0.05, "1": 0.01, "2": 3.5}, {"0": 100, "1": 10, "2": 100}
    (f,) = straggler(window([r0, r1]), TH)
    assert f.where["ranks"] == ["1"]
    cause = " ".join(f.evidence["candidate_causes"])
    assert "rank 1 spends 36 ms per step in Python's garbage collector" in cause and "1 per step" in cause
    assert f.evidence["gc_s_per_step"] == {"0": pytest.approx(0.0006), "1": pytest.approx(0.0356)}
    assert f.action.startswith("rank 1: its Python garbage collector pauses it")
    # the same lateness without GC series: no GC cause, the usual action
    r1.gc_s = r1.gc_n = {}
    (g,) = straggler(window([r0, r1]), TH)
    assert not any("garbage" in c for c in g.evidence["candidate_causes"]) and "garbage" not in g.action


def test_query_parts_parse_back_per_generation_and_device():
    parts = health_parts('otelgpu_job="j"', "60s", selector)
    assert "otelgpu_train_allocator_retries_total" in parts["aretry:otelgpu_cuda_device"]
    assert "avg_over_time" in parts["ainam:otelgpu_cuda_device"] and "offset 60s" in parts["gc0:otelgpu_gc_generation"]
    v = {"gc_2": 5.0, "gc0_2": 1.0, "gc_0": 0.3, "gcn_2": 12.0, "aretry_0": 40.0, "aretry0_0": 7.0, "aoom_0": 1.0,
         "aresm_0": 10.0 * GIB, "ainam_0": 2.5 * GIB, "aresx_1": 3.0 * GIB}
    got = health_inputs(v)
    assert got["gc_s"] == {"2": 4.0, "0": 0.3} and got["gc_n"] == {"2": 12.0}
    a = got["alloc"]["0"]
    assert (a.retries, a.ooms, a.fragmentation) == (33.0, 1.0, 0.25)
    assert got["alloc"]["1"].reserved_max_b == 3.0 * GIB and got["alloc"]["1"].retries is None


def test_rules_list_runs_the_allocator_rule():
    r = with_alloc(rank(0), cuda0=AllocatorWindow(retries=3, ooms=1))
    assert any(f.rule == "allocator" and not f.missing for f in run_rules(window([r], [gpu(0)])))
