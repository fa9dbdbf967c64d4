"""Findings decided on the evidence that settles them, each on a trace where it must fire and its twin
where it must not: launch-bound (queue depth), idle causes, a queue-draining sync, framework syncs,
pageable copies on the critical path, GEMMs off the tensor-core fast path, advice that checks the run."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.trace.analyze import analyze
from otel_gpu.trace.gemm_kernels import classify, device_arch, misaligned_dims
from otel_gpu.trace.model import load_set
from findings_traces import (A100, GEMM_SM80, GEMM_SM80_ALIGN1, GEMM_SM90, H100, SGEMM, drain_trace, gemm_trace,
                             queue_trace, write)
from kineto import training_trace


def analysed(tmp_path, builder, device=H100, record_shapes=False, name="r0.json"):
    write(builder, str(tmp_path / name), device, record_shapes)
    doc = analyze(load_set(str(tmp_path)))
    return doc, {f["pattern"]: f for f in doc["findings"]}, {c["pattern"]: c for c in doc["checks"]}


# launch-bound: the GPU must actually wait for launches

def test_gpu_bound_run_with_deep_queue_is_not_launch_bound(tmp_path):
    _, found, checks = analysed(tmp_path, queue_trace(deep=True))
    c = checks["many_short_kernels"]
    assert c["where"]["short_kernels_pct"] > 90  # HTA's short-kernel count alone would call it launch-bound
    assert c["where"]["median_queue_at_launch"] > 50 and c["where"]["launches_delayed_over_100us_pct"] > 90
    assert c["value"] < 1 and not c["triggered"] and "many_short_kernels" not in found


def test_launch_bound_run_is(tmp_path):
    _, found, checks = analysed(tmp_path, queue_trace(deep=False))
    f = found["many_short_kernels"]
    assert f["indicator"]["name"] == "GPU idle waiting for launches, % of GPU span"
    assert f["indicator"]["median"] > 25  # ~13 us of idle before each of 600 launches in a ~36 ms span
    assert checks["many_short_kernels"]["where"]["median_queue_at_launch"] <= 1
    assert f["time_at_stake_us"] == pytest.approx(checks["many_short_kernels"]["idle_caused_us"])


def test_short_kernels_beside_a_busy_stream_are_not_launch_bound(tmp_path):
    training_trace(0, short_kernels=True).write(str(tmp_path / "r0.json"))
    doc = analyze(load_set(str(tmp_path)))
    (c,) = [c for c in doc["checks"] if c["pattern"] == "many_short_kernels"]
    # only the 400 us between steps (the CPU idle, nothing to launch) is starvation: under the threshold
    assert c["where"]["short_kernels_pct"] >= 30 and c["value"] < c["threshold"] and not c["triggered"]


def test_advice_leaves_out_what_the_run_already_does(tmp_path):
    _, found, _ = analysed(tmp_path, queue_trace(deep=False))
    assert "fused optimizer" in found["many_short_kernels"]["fix"]
    (tmp_path / "r0.json").unlink()
    _, found, _ = analysed(tmp_path, queue_trace(deep=False, fused_optimizer=True))
    fix = found["many_short_kernels"]["fix"]
    assert "use a fused optimizer" not in fix and "Already in use: fused optimizer (aten::_fused_adamw_)" in fix


# GPU idle by cause, and the sync that drains the queue every step

def test_idle_attributed_to_the_drain_the_data_loader_and_the_copy(tmp_path):
    _, found, _ = analysed(tmp_path, drain_trace())
    w = found["long_gpu_idle"]["where"]
    # per step: 3,728 us from the end of the GPU work (inside .item()'s sync) to the next copy, 190 us after
    # the pageable copy while its call still blocks the CPU
    assert w["idle_by_cause_us"] == {"sync_drain": 2 * 3728.0, "h2d_copy": 3 * 190.0}
    assert w["idle_fill_us"]["sync_drain"]["data_loader_us"] == 2 * 1500  # the drain exposed the data loader
    assert w["largest_gaps"][0]["cause"] == "sync_drain" and w["largest_gaps"][0]["position_in_step_pct"] == 79.7
    assert w["end_of_step_idle_us"] == 2 * 3728.0
    assert found["long_gpu_idle"]["caused_by"][0]["pattern"] == "queue_drain_sync"
    assert found["long_gpu_idle"]["fix"].startswith("The GPU waits; biggest causes first: after a user sync")


def test_queue_drain_sync_fires_where_the_gpu_ran_dry(tmp_path):
    _, found, _ = analysed(tmp_path, drain_trace())
    f = found["queue_drain_sync"]
    assert f["indicator"]["median"] == 100  # both steps followed by GPU work
    assert f["time_at_stake_us"] == 2 * 3728.0
    w = f["where"]
    assert w["ops"] == [["aten::_local_scalar_dense", 2]] and w["calls"] == [["cudaStreamSynchronize", 2]]
    assert w["queue_before_sync"] == 47 and w["position_in_step_pct"] == 79.7
    assert w["drained_idle_fill_us"]["data_loader_us"] == 3000


@pytest.mark.parametrize("builder", [lambda: drain_trace(item=False), lambda: training_trace(0)])
def test_queue_drain_sync_absent(tmp_path, builder):
    """No sync, or a sync per step while the GPU stays busy (the clean training trace): no drain."""
    _, found, checks = analysed(tmp_path, builder())
    assert "queue_drain_sync" not in found and checks["queue_drain_sync"]["value"] == 0


def test_framework_syncs_are_told_apart_from_the_users(tmp_path):
    _, found, checks = analysed(tmp_path, drain_trace(ddp_syncs=9), name="ddp.json")
    c = checks["too_many_syncs"]
    assert c["value"] == 1 and "too_many_syncs" not in found  # .item() only; DDP's 9 event syncs not counted
    assert c["indicator"] == "user host syncs per step"
    assert c["where"]["not_counted"] == {"framework": 27, "short_event": 0, "per_step": 9.0,
                                         "scopes": [["DistributedDataParallel.forward", 27]]}
    (tmp_path / "ddp.json").unlink()
    _, _, checks = analysed(tmp_path, drain_trace(short_event_syncs=9), name="short.json")
    assert checks["too_many_syncs"]["value"] == 1
    assert checks["too_many_syncs"]["where"]["not_counted"]["short_event"] == 27
    (tmp_path / "short.json").unlink()
    _, found, _ = analysed(tmp_path, drain_trace(stray_syncs=9))
    assert found["too_many_syncs"]["indicator"]["median"] == 10  # the user's own stream syncs are counted


# pageable host-to-device copies on the critical path

def test_pageable_copy_on_the_critical_path(tmp_path):
    _, found, _ = analysed(tmp_path, drain_trace(), record_shapes=True)
    f = found["pageable_h2d"]
    # 3 copies of 80 us, plus the GPU idle while the CPU was blocked in their 300 us calls
    assert f["where"]["gpu_idle_during_calls_us"] == 461 and f["time_at_stake_us"] == 3 * 80 + 461
    assert f["where"]["shapes"] == [["aten::copy_ [[8, 1024], [8, 1024]] long int", 3]]
    assert "misaligned_dims" not in f["where"]


def test_pinned_copies_are_not_flagged(tmp_path):
    _, found, checks = analysed(tmp_path, drain_trace(pageable=False))
    assert "pageable_h2d" not in found and checks["pageable_h2d"]["value"] == 0


# GEMMs off the tensor-core fast path

LM_HEAD = [[8192, 768], [768, 50257]]


def test_misaligned_gemm_names_the_op_shape_and_dimension(tmp_path):
    _, found, _ = analysed(tmp_path, gemm_trace(GEMM_SM80_ALIGN1, LM_HEAD), record_shapes=True)
    assert list(found) == ["gemm_misaligned"]  # not counted again as an older-architecture kernel
    f = found["gemm_misaligned"]
    assert f["indicator"]["median"] == 25 and f["time_at_stake_us"] == 3 * 5 * 400
    w = f["where"]
    assert w["misaligned_dims"] == [50257] and w["alignment"] == ["align1"] and w["kernel_archs"] == ["sm80"]
    assert w["shapes"] == [["aten::mm [[8192, 768], [768, 50257]] BFloat16", 15]]
    assert "50,304" in f["fix"]


def test_padded_vocabulary_gets_no_gemm_finding(tmp_path):
    _, found, checks = analysed(tmp_path, gemm_trace(GEMM_SM90, [[8192, 768], [768, 50304]]), record_shapes=True)
    assert not [p for p in found if p.startswith("gemm")]
    assert checks["gemm_misaligned"]["value"] == checks["gemm_old_arch"]["value"] == 0


def test_shapes_not_recorded_says_so(tmp_path):
    _, found, _ = analysed(tmp_path, gemm_trace(GEMM_SM80_ALIGN1, LM_HEAD))
    assert found["gemm_misaligned"]["where"]["shapes"] == "not in the trace (profile with record_shapes=True)"


@pytest.mark.parametrize("device,fires", [(H100, True), (A100, False), (None, False)])
def test_older_architecture_gemms(tmp_path, device, fires):
    _, found, checks = analysed(tmp_path, gemm_trace(GEMM_SM80, [[8192, 768], [768, 3072]]), device=device)
    assert ("gemm_old_arch" in found) is fires
    if device is None:
        assert "not checked: the trace names no NVIDIA device" in checks["gemm_old_arch"]["indicator"]
    if fires:
        assert found["gemm_old_arch"]["where"]["kernel_archs"] == ["sm80"]


def test_fp32_gemms_in_a_bf16_run(tmp_path):
    _, found, _ = analysed(tmp_path, gemm_trace(GEMM_SM90, [[8192, 768], [768, 3072]], fp32_kernel=SGEMM))
    assert list(found) == ["gemm_fp32"]  # an sgemm is an fp32 problem, not an architecture one
    assert found["gemm_fp32"]["indicator"]["median"] == 20


def test_fp32_gemms_in_an_fp32_run_are_not_flagged(tmp_path):
    training_trace(0).write(str(tmp_path / "r0.json"))  # every GEMM an ampere_sgemm
    doc = analyze(load_set(str(tmp_path)))
    (c,) = [c for c in doc["checks"] if c["pattern"] == "gemm_fp32"]
    assert c["value"] == 100 and not c["triggered"] and "not checked" in c["indicator"]


def test_terminal_names_idle_causes_and_the_dimension(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write(drain_trace(), str(tmp_path / "a" / "r0.json"), H100)
    write(gemm_trace(GEMM_SM80_ALIGN1, LM_HEAD), str(tmp_path / "b" / "r0.json"), H100, record_shapes=True)
    assert main(["trace", "analyze", str(tmp_path / "a")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "idle by cause: after a user sync drained the queue 93%, host-to-device copy calls 7%" in out
    assert "47 launches queued when it began" in out
    assert main(["trace", "analyze", str(tmp_path / "b"), "--json", str(tmp_path / "o.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "dims breaking 16-byte alignment: 50,257" in out and "kernels built for sm80" in out
    doc = json.loads((tmp_path / "o.json").read_text())
    assert all("_shape_ext" not in c for c in doc["checks"])


# kernel names and shapes (pure parsers)

@pytest.mark.parametrize("name,misaligned,arch,fp32", [
    (GEMM_SM80_ALIGN1, True, 80, False), (GEMM_SM90, False, 90, False), (SGEMM, False, 80, True),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align2>(Params)", True, 80,
     False),
    ("cutlass_80_tensorop_s1688gemm_tf32_128x128_16x4_nn_align4", False, 80, False),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", False, 80, False),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT", False, None, False),
])
def test_gemm_kernel_names(name, misaligned, arch, fp32):
    k = classify(name)
    assert k.gemm and (k.misaligned, k.arch, k.fp32_simt) == (misaligned, arch, fp32)


def test_non_gemm_kernels_and_devices():
    assert not classify("void at::native::vectorized_elementwise_kernel<4>(int, float*)").gemm
    assert not classify("softmax_warp_forward").misaligned
    assert device_arch({"deviceProperties": [H100]}) == (90, "NVIDIA H100 80GB HBM3")
    assert device_arch({"deviceProperties": [{"name": "AMD Radeon Graphics", "computeMajor": 9}]})[0] is None
    assert device_arch({}) == (None, "") and device_arch({"deviceProperties": "x"}) == (None, "")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_classify_any_name(name):
    k = classify(name)
    assert not k.misaligned or (k.gemm and k.align * (k.elem_bytes or 2) < 16)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1 << 20), max_size=4), max_size=4),
       st.sampled_from(["c10::BFloat16", "c10::Half", "float", "c10::Float8_e4m3fn"]))
def test_misaligned_dims_are_the_last_two_dims_off_16_bytes(dims, dtype):
    need = {"float": 4, "c10::Float8_e4m3fn": 16}.get(dtype, 8)
    want = {x for d in dims if d for x in d[-2:] if x % need}
    assert set(misaligned_dims(dims, [dtype] * len(dims))) == want


@given(st.one_of(st.none(), st.integers(), st.text(), st.lists(st.one_of(st.text(), st.none(), st.floats()))))
def test_misaligned_dims_ignores_what_is_not_a_shape(dims):
    assert misaligned_dims(dims, None) == []


# tables: instance statistics beside HTA's columns

def test_kernel_table_has_instance_statistics_beside_htas(tmp_path):
    from kineto import Builder
    b = Builder(0)
    t = 1000
    for i in range(12):  # 12 names: the table folds; kernel i runs i + 1 times for 10 * (i + 1) us
        for _ in range(i + 1):
            b.launch("aten::mm", f"gemm_kernel_{i:02d}", t, t + 100, 10 * (i + 1))
            t += 200
    b.write(str(tmp_path / "r0.json"))
    rows = {r["name"]: r for r in analyze(load_set(str(tmp_path)))["kernel_breakdown"]}
    top = rows["gemm_kernel_11"]  # 12 kernels of 120 us
    assert (top["kernels"], top["kernel_mean"], top["kernel_max"]) == (12, 120, 120)
    assert top["mean"] == top["max"] == 12 * 120  # HTA's columns, once folded: the name's sum
    others = rows["others"]
    folded = [i for i in range(12) if f"gemm_kernel_{i:02d}" not in rows]
    n = sum(i + 1 for i in folded)
    assert others["kernels"] == n and others["kernel_max"] == 10 * (max(folded) + 1)
    assert others["kernel_mean"] == pytest.approx(sum((i + 1) * 10 * (i + 1) for i in folded) / n)


# shapes read back from a trace (both decoders agree; a bad file gives a note, not an error)

def test_shapes_reader_decoders_agree(tmp_path):
    from otel_gpu.trace import op_shapes
    path = write(gemm_trace(GEMM_SM80_ALIGN1, LM_HEAD), str(tmp_path / "r0.json.gz"), H100, record_shapes=True)
    data = op_shapes._open(path)
    by_json = {ext: args() for cat, name, ext, args in op_shapes._events_json(data) if cat == "cpu_op"}
    by_msgspec = {ext: args() for cat, name, ext, args in op_shapes._events_msgspec(data) if cat == "cpu_op"}
    assert by_json == by_msgspec and [[8192, 768], [768, 50257]] in [d for d, _ in by_json.values()]
    shapes, why = op_shapes.input_shapes(path, set(by_json))
    assert why is None and {s["op"] for s in shapes.values()} == {"aten::mm"}


def test_shapes_reader_on_a_damaged_file(tmp_path):
    from otel_gpu.trace.op_shapes import input_shapes
    (tmp_path / "bad.json").write_text('{"traceEvents": [{"cat": "cpu_op", "args": {"External id": 1, ')
    shapes, why = input_shapes(str(tmp_path / "bad.json"), {1})
    assert shapes == {} and why.startswith("shapes not read:")
    assert input_shapes(str(tmp_path / "missing.json"), {1})[1].startswith("shapes not read:")


def test_shapes_reader_reads_a_bounded_text(tmp_path, monkeypatch):
    """A small gzip file can inflate to any size: more than MAX_BYTES of text is not read."""
    import gzip

    from otel_gpu.trace import op_shapes
    path = write(gemm_trace(GEMM_SM80_ALIGN1, LM_HEAD), str(tmp_path / "r0.json.gz"), H100, record_shapes=True)
    text_bytes = len(gzip.decompress(open(path, "rb").read()))
    monkeypatch.setattr(op_shapes, "MAX_BYTES", text_bytes - 1)
    shapes, why = op_shapes.input_shapes(path, {1, 2, 3})
    assert shapes == {} and why.startswith("shapes not read: r0.json.gz holds over")
    (tmp_path / "cut.json.gz").write_bytes(open(path, "rb").read()[:-9])   # a damaged gzip stream
    monkeypatch.setattr(op_shapes, "MAX_BYTES", 1 << 30)
    assert op_shapes.input_shapes(str(tmp_path / "cut.json.gz"), {1})[1].startswith("shapes not read:")


@pytest.mark.parametrize("name,tags", [
    ("aten::broadcast_tensors", set()), ("nccl:all_reduce", {"comm", "framework"}),
    ("DistributedDataParallel.forward", {"framework"}), ("aten::_fused_adamw_", {"fused_optimizer"}),
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", {"data_loader"}),
    ("aten::_foreach_add_", {"foreach_optimizer"}), ("triton_poi_fused_add_0", {"torch_compile"}),
    ("cudaGraphLaunch", {"cuda_graphs"}), ("aten::mm", set()),
])
def test_name_tags(name, tags):
    from otel_gpu.trace.name_tags import name_tags
    assert set(name_tags(name)) == tags
