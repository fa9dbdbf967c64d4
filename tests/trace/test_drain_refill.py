"""Idle that a drain caused is the drain's: the launch gaps while a drained queue is refilled go to the
sync, launch-bound is left for a queue that runs empty with no drain before it; every launch-bound
verdict states the profiler's possible share of the step."""
import math

import pytest

from otel_gpu.trace.analyze import Options, analyze
from otel_gpu.trace.model import load_set
from otel_gpu.trace.profiler_share import NOT_GIVEN, profiler_share
from findings_traces import ELEMENTWISE, GEMM_SM90, H100, kernel, queue_trace, write
from kineto import STEP_US, Builder

TINY = 150          # tiny kernels at the start of each step, each launched after the previous ended
TINY_GAP_US = 13    # the GPU waits this long for each of them


def _item(b: Builder, cpu_ts: float, gpu_end: float, sync_copy: bool = False) -> None:
    """``.item()``: a D2H copy queued behind everything, then a stream sync until the GPU ran dry (with
    ``sync_copy``: one synchronous ``cudaMemcpy`` that returns after the copy, as older PyTorch does)."""
    ext = b.cpu("aten::_local_scalar_dense", cpu_ts, gpu_end - cpu_ts + 8)
    corr = b.runtime("cudaMemcpy" if sync_copy else "cudaMemcpyAsync", cpu_ts + 1,
                     gpu_end + 2 - cpu_ts + 2 if sync_copy else 4, ext)
    b.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7,
                     "ts": gpu_end, "dur": 2, "args": {"External id": ext, "device": 0, "stream": 7, "correlation": corr}})
    if not sync_copy:
        b.runtime("cudaStreamSynchronize", cpu_ts + 6, gpu_end + 2 - cpu_ts - 6 + 3, ext)


def refill_trace(item: bool = True, pre_us: float = 3000, sync_copy: bool = False, blip: bool = False) -> Builder:
    """Per 10 ms step: 150 tiny kernels (2 us), each launched only after the previous one ended (the GPU
    waits ~13 us for each: 1.95 ms a step), then 30 GEMMs of 200 us launched 10 us apart (the CPU gets
    ahead: the queue holds work again), then, with ``item``, ``.item()`` on the loss: a sync that waits
    ~5.6 ms for the GEMMs to drain. A previous iteration's ``.item()`` (``pre_us`` of work) precedes step 1.
    Without ``item`` the same program has no sync: its starvation is its own (launch-bound). ``blip``: the
    76th tiny kernel runs 14 us, outlasting the next launch call by 1 us (the CPU is not ahead for that)."""
    b = Builder(0)
    pre = 1_000_000 - 4000
    kernel(b, "aten::mm", GEMM_SM90, pre, pre + 10, pre_us)
    if item:
        _item(b, pre + 20, pre + 10 + pre_us, sync_copy)
    for step in range(4):
        t0 = 1_000_000 + step * STEP_US
        b.cpu(f"ProfilerStep#{step + 1}", t0, STEP_US - 1, cat="user_annotation")
        for i in range(TINY):
            kernel(b, "aten::add_", ELEMENTWISE, t0 + 10 + 15 * i, t0 + 18 + 15 * i, 14 if blip and i == 75 else 2)
        g0 = t0 + 2310
        for i in range(30):
            kernel(b, "aten::mm", GEMM_SM90, t0 + 2300 + 10 * i, g0 + 200 * i, 200)
        if item:
            _item(b, t0 + 2700, g0 + 200 * 30, sync_copy)
    return b


def analysed(tmp_path, builder, **opts):
    write(builder, str(tmp_path / "r0.json"), H100)
    doc = analyze(load_set(str(tmp_path)), Options(**opts))
    return {f["pattern"]: f for f in doc["findings"]}, {c["pattern"]: c for c in doc["checks"]}


def test_refill_after_a_drain_is_the_drains_not_launch_bound(tmp_path):
    found, checks = analysed(tmp_path, refill_trace(item=True))
    c = checks["many_short_kernels"]
    assert c["where"]["short_kernels_pct"] > 80   # the short-kernel count alone would call it launch-bound
    assert not c["triggered"] and "many_short_kernels" not in found and c["value"] < 1
    idle = checks["long_gpu_idle"]["where"]["idle_by_cause_us"]
    # steps 1-3 (the last excluded): each begins by refilling the queue drained just before it: 149 gaps
    # between the tiny kernels, then 55 us until the first GEMM (whose launch finds the GPU idle)
    assert idle["sync_refill"] == 3 * ((TINY - 1) * TINY_GAP_US + 55)
    assert "launch_starvation" not in idle
    drain = found["queue_drain_sync"]
    assert drain["where"]["refill_idle_us"] == pytest.approx(idle["sync_refill"])
    assert drain["time_at_stake_us"] == pytest.approx(idle["sync_drain"] + idle["sync_refill"])


def test_one_kernel_outlasting_a_launch_call_does_not_end_the_refill(tmp_path):
    _, checks = analysed(tmp_path, refill_trace(blip=True))
    idle = checks["long_gpu_idle"]["where"]["idle_by_cause_us"]
    # the 1 us gap after the long kernel: its successor was launched before the GPU ran dry (queued, waited)
    assert idle["queued_work_waited"] == 3 * 1
    assert "launch_starvation" not in idle and idle["sync_refill"] == 3 * ((TINY - 2) * TINY_GAP_US + 55)


def test_a_synchronous_d2h_copy_drains_too(tmp_path):
    found, checks = analysed(tmp_path, refill_trace(sync_copy=True))
    idle = checks["long_gpu_idle"]["where"]["idle_by_cause_us"]
    assert "many_short_kernels" not in found and "launch_starvation" not in idle
    assert idle["sync_refill"] == 3 * ((TINY - 1) * TINY_GAP_US + 55)


def test_refill_counted_up_to_the_lead_the_sync_threw_away(tmp_path):
    """Before step 1 the sync waited only ~490 us: of step 1's 1.99 ms of launch gaps, about that much is
    the refill's, the rest the program's own starvation."""
    _, checks = analysed(tmp_path, refill_trace(pre_us=500))
    idle = checks["long_gpu_idle"]["where"]["idle_by_cause_us"]
    step = (TINY - 1) * TINY_GAP_US + 55
    assert 2 * step + 490 <= idle["sync_refill"] <= 2 * step + 490 + TINY_GAP_US
    assert idle["sync_refill"] + idle["launch_starvation"] == 3 * step


def test_same_program_without_the_sync_is_launch_bound(tmp_path):
    found, checks = analysed(tmp_path, refill_trace(item=False))
    f = found["many_short_kernels"]
    idle = checks["long_gpu_idle"]["where"]["idle_by_cause_us"]
    assert "sync_refill" not in idle and idle["launch_starvation"] >= 3 * ((TINY - 1) * TINY_GAP_US + 55)
    assert f["where"]["profiler_overhead"] == {"checked": False, "text": NOT_GIVEN}


def test_truly_launch_bound_states_the_profilers_share(tmp_path):
    found, _ = analysed(tmp_path, queue_trace(deep=False), unprofiled_step_us={0: 8_000.0})
    share = found["many_short_kernels"]["where"]["profiler_overhead"]
    # captured steps of 10 ms (9,999 us annotations) against 8 ms unprofiled: up to 20% is the profiler's
    assert share["checked"] and share["profiler_share_pct"] == pytest.approx(20.0, abs=0.1)
    assert "10.00 ms against 8.00 ms unprofiled" in share["text"]
    (tmp_path / "r0.json").unlink()
    found, _ = analysed(tmp_path, queue_trace(deep=False), unprofiled_step_us={5: 8_000.0})
    assert not found["many_short_kernels"]["where"]["profiler_overhead"]["checked"]


@pytest.mark.parametrize("unprofiled,checked", [(None, False), (math.nan, False), (0.0, False), (-1.0, False),
                                                (math.inf, False), (5_000.0, True), (20_000.0, True)])
def test_profiler_share_edges(unprofiled, checked):
    got = profiler_share([(1, 0.0, 10_000.0), (2, 10_000.0, 20_000.0)], unprofiled)
    assert got["checked"] is checked and got["text"].startswith("captured" if checked else "profiler overhead not")
    if checked:
        assert got["profiler_share_pct"] == max(0.0, 100 * (10_000 - unprofiled) / 10_000)
    assert not profiler_share([], 5_000.0)["checked"]


def test_drained_steps_are_a_share_of_the_counted_steps_and_each_sync_listed_once(tmp_path):
    """Steps 1-5 each drain the queue, but step 5 ends long after the GPU's last event (its drain is
    followed by one last kernel, then nothing) and is not counted: 4 of 4 counted steps (100%), not 5 of
    4; each sync listed once, not once per gap it drained."""
    b = refill_trace(item=True)
    t5 = 1_000_000 + 4 * STEP_US
    b.cpu("ProfilerStep#5", t5, STEP_US - 1, cat="user_annotation")
    kernel(b, "aten::mm", GEMM_SM90, t5 + 10, t5 + 20, 500)
    _item(b, t5 + 30, t5 + 520)
    kernel(b, "aten::add_", ELEMENTWISE, t5 + 600, t5 + 610, 2)
    b.cpu("ProfilerStep#6", t5 + STEP_US, STEP_US - 1, cat="user_annotation")   # the last step: dropped
    found, _ = analysed(tmp_path, b)
    drain = found["queue_drain_sync"]
    assert drain["indicator"]["max"] == 100.0
    ((op, n),) = drain["where"]["ops"]
    assert op == "aten::_local_scalar_dense" and n <= 6   # six .item() calls in the trace
