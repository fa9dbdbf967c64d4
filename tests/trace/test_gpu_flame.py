"""GPU time by the code that launched it: on shared traces the flame graph adds up to the kernels' GPU
time; on a crafted trace every kernel sits under the op (and Python frames) that launched it; the push
decodes in the project's own Pyroscope receiver and in the recording's pprof reader."""
import gzip
import json
import math
import os

import argparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.record.decode import decompress, push_profiles
from otel_gpu.trace.gpu_flame_cli import _label, _push_url
from otel_gpu.trace.gpu_flame import NO_LAUNCH, folded_text, frame, gpu_time_stacks, top_stacks, trace_dir_stacks
from otel_gpu.trace.gpu_push import SAMPLE_TYPE, push, push_body
from otel_gpu.trace.model import load_set
from pyroscope_receiver import Receiver, parse_push
from shared_data import SHARED_DATA, needs_shared_data

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
SETS = ["hta_sampled_2rank", "hta_nccl_data", "hta_alexnet_single_rank", "edge_cases/hta_amd_mi250_rocm"]
OLD_CATS = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel", "gpu_memcpy": "Memcpy",
            "gpu_memset": "Memset"}   # older Kineto's spelling (PyTorch 1.8, the TensorBoard plugin's samples)


def _gpu_ns_from_json(path: str) -> int:
    """Independently of the reader: the GPU work events' durations in the file, as whole ns; in a trace
    of nanosecond resolution (a fractional ts) rounded as HTA does (start up, end down, at least 0)."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as fh:
        doc = json.load(fh)
    events = [e for e in (doc["traceEvents"] if isinstance(doc, dict) else doc) if isinstance(e, dict)]
    ns_trace = any(isinstance(e.get("ts"), float) for e in events)
    gpu = [e for e in events if str(e.get("cat", "")).lower() in GPU_CATS and e.get("ph") == "X"]
    if ns_trace:
        return sum(1000 * max(0, math.floor(e["ts"] + e["dur"]) - math.ceil(e["ts"])) for e in gpu)
    return sum(round(e["dur"] * 1000) for e in gpu)


@needs_shared_data("traces")
@pytest.mark.parametrize("name", SETS)
def test_flame_total_is_the_kernels_gpu_time(name):
    d = str(SHARED_DATA / "traces" / name)
    ts = load_set(d, include_last_step=True)
    per_rank = trace_dir_stacks(d, include_last_step=True)
    assert set(per_rank) == set(ts.ranks)
    for rank, v in ts.ranks.items():
        assert sum(per_rank[rank].values()) == _gpu_ns_from_json(v.ev.path) > 0
        unlinked = sum(ns for s, ns in per_rank[rank].items() if s[0] == NO_LAUNCH)
        if name.startswith("hta_"):   # CUDA traces: every kernel's launch is in the trace
            assert unlinked == 0


# a crafted trace: main thread and autograd thread, Python frames, each kind of GPU work

def _x(events, cat, name, ts, dur, tid=1, **args):
    events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args})


def _launch(events, corr, op, call, ts, kernel, cat, gpu_ts, gpu_dur, tid=1, stream=7):
    _x(events, "cpu_op", op, ts, 20, tid)
    _x(events, "cuda_runtime", call, ts + 2, 10, tid, correlation=corr)
    events.append({"ph": "X", "cat": cat, "name": kernel, "pid": 0, "tid": stream, "ts": gpu_ts, "dur": gpu_dur,
                   "args": {"device": 0, "stream": stream, "correlation": corr}})


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_kernel"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def crafted(path, old_cats=False):
    ev = [{"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python"}}]
    _x(ev, "user_annotation", "ProfilerStep#3", 1000, 2000)
    _x(ev, "python_function", "train.py(42): step", 1001, 1900)
    _x(ev, "python_function", "nn.Module: Linear_0", 1010, 200)
    _x(ev, "cpu_op", "aten::linear", 1020, 100)
    _launch(ev, 11, "aten::addmm", "cudaLaunchKernel", 1030, GEMM, "kernel", 1100, 300.5)
    _launch(ev, 12, "aten::copy_", "cudaMemcpyAsync", 1300, "Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 1400, 40)
    _launch(ev, 13, "aten::zero_", "cudaMemsetAsync", 1400, "Memset (Device)", "gpu_memset", 1450, 3)
    _x(ev, "cpu_op", "c10d::allreduce_", 1500, 100)
    _launch(ev, 14, "nccl:all_reduce", "cudaLaunchKernel", 1510, NCCL, "kernel", 1600, 700, stream=20)
    # the autograd thread: its top-level op goes under the step
    _x(ev, "cpu_op", "autograd::engine::evaluate_function: MmBackward0", 1700, 100, tid=2)
    _x(ev, "cpu_op", "MmBackward0", 1705, 80, tid=2)
    _launch(ev, 15, "aten::mm", "cudaLaunchKernel", 1710, GEMM, "kernel", 2400, 250, tid=2)
    # a kernel whose launch is not in the trace
    ev.append({"ph": "X", "cat": "kernel", "name": "orphan_kernel", "pid": 0, "tid": 7, "ts": 2800, "dur": 9,
               "args": {"device": 0, "stream": 7, "correlation": 99}})
    if old_cats:
        for e in ev:
            e["cat"] = OLD_CATS.get(e.get("cat"), e.get("cat"))
    with open(path, "w") as fh:
        json.dump({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ev}, fh)
    return path


EXPECTED = {
    ("ProfilerStep", "train.py(42): step", "nn.Module: Linear_0", "aten::linear", "aten::addmm", GEMM): 300_500,
    ("ProfilerStep", "train.py(42): step", "aten::copy_", "[memcpy HtoD]", "Memcpy HtoD (Pinned -> Device)"): 40_000,
    ("ProfilerStep", "train.py(42): step", "aten::zero_", "[memset]", "Memset (Device)"): 3_000,
    ("ProfilerStep", "train.py(42): step", "c10d::allreduce_", "nccl:all_reduce", "[nccl]", NCCL): 700_000,
    ("ProfilerStep", "autograd::engine::evaluate_function: MmBackward0", "MmBackward0", "aten::mm", GEMM): 250_000,
    (NO_LAUNCH, "orphan_kernel"): 9_000,
}


@pytest.mark.parametrize("old_cats", [False, True])
def test_every_kernel_under_the_code_that_launched_it(tmp_path, old_cats):
    crafted(str(tmp_path / "r0.json"), old_cats)
    (v,) = load_set(str(tmp_path)).ranks.values()
    stacks = gpu_time_stacks(v)
    assert stacks == EXPECTED
    text = folded_text(stacks)
    assert text.splitlines()[0] == ";".join(next(iter(sorted(EXPECTED, key=lambda s: -EXPECTED[s])))) + " 700000"
    top = top_stacks({0: stacks}, 2)
    assert [ns for _, ns, _ in top] == [700_000, 300_500] and top[0][2] == round(100 * 700_000 / 1_302_500, 1)


STACK_TRACE = os.path.join(os.path.dirname(__file__), "..", "data", "traces", "cpu_with_stack", "rank0.json.gz")


def test_python_and_module_frames_of_a_real_with_stack_trace(tmp_path):
    """A real trace recorded with with_stack and with_modules (CPU: no kernels of its own), with a launch
    call and a kernel added inside each addmm, mm and relu op: every kernel under its op, under the
    module and the Python frames that ran it."""
    with gzip.open(STACK_TRACE, "rt") as fh:
        doc = json.load(fh)
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] in ("aten::addmm", "aten::mm",
                                                                                       "aten::relu")]
    for i, op in enumerate(ops):
        doc["traceEvents"] += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": op["pid"], "tid": op["tid"],
             "ts": int(op["ts"]) + 2, "dur": 1, "args": {"correlation": 10 + i}},   # whole us: kept by rounding
            {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": int(op["ts"]) + 5, "dur": 2.0,
             "args": {"device": 0, "stream": 7, "correlation": 10 + i}}]
    with open(tmp_path / "rank0.json", "w") as fh:
        json.dump(doc, fh)
    stacks = trace_dir_stacks(str(tmp_path), include_last_step=True)[0]
    assert len(ops) >= 18 and sum(stacks.values()) == 2000 * len(ops)
    by_leaf = {s[-1]: s for s in stacks}
    for i, op in enumerate(ops):
        s = by_leaf[f"k{i}"]
        assert op["name"] in s and s[0].startswith("make_stack_trace.py("), s
        if op["name"] != "aten::mm":   # the forward ops: under their module (aten::mm: the backward)
            module = "nn.Module: ReLU_0" if op["name"] == "aten::relu" else "nn.Module: Linear_"
            assert any(f.startswith(module) for f in s) and ("aten::linear" in s or op["name"] == "aten::relu")
        else:
            assert any(f.startswith("autograd::engine::evaluate_function") for f in s)
        assert not any(" at 0x" in f for f in s)   # built-ins' addresses left out: one frame in every process


def test_frames_are_safe_and_fold():
    assert frame("ProfilerStep#17") == "ProfilerStep"
    assert frame("<built-in method run_backward of torch._C._EngineBase object at 0x7f869846fbc0>") == \
        "<built-in method run_backward of torch._C._EngineBase object>"
    assert frame("a;b\x1b[31m\n") == "a\\x3bb\\x1b[31m\\n"
    assert folded_text({("x;", "k"): 5, ("z",): 0}) == "x;;k 5\n"   # (frames come from frame(): ";" escaped)


def test_push_decodes_in_the_receiver_and_the_pprof_reader(tmp_path):
    crafted(str(tmp_path / "r0.json"))
    stacks = trace_dir_stacks(str(tmp_path))[0]
    per_rank = {0: stacks, 3: stacks, 5: {}}
    body = push_body(per_rank, "otelgpu.demo", job="demo", time_ns=1_700_000_000_000_000_000)
    with Receiver() as rx:
        push(rx.url, body)
        got = rx.profiles
    assert sorted(p.series["rank"] for p in got) == ["0", "3"]   # a rank without GPU time sends nothing
    for p in got:
        assert p.series == {"__name__": SAMPLE_TYPE, "service_name": "otelgpu.demo", "rank": p.series["rank"],
                            "job": "demo"}
        assert p.sample_types == [("gpu_time", "nanoseconds")]
        assert {tuple(reversed(s.stack)): s.value for s in p.samples} == EXPECTED
    rows = push_profiles(decompress(body, "gzip"))
    assert len(rows) == 2 and all(r.sample_type == "gpu_time" and r.unit == "nanoseconds" for r in rows)
    assert {stack: value for stack, _, value in rows[0].samples} == EXPECTED
    assert rows[0].t0 == 1_700_000_000.0
    assert [len(p.samples) for p in parse_push(body)] == [6, 6]


def test_cli_writes_folded_files_and_pushes(tmp_path, capsys):
    crafted(str(tmp_path / "r0.json"))
    out = tmp_path / "folded"
    with Receiver() as rx:
        rc = main(["trace", "analyze", str(tmp_path), "--folded", str(out), "--push", rx.url, "--job", "j1",
                   "--json", str(tmp_path / "doc.json")])
        assert rc == 0 and rx.profiles[0].series["service_name"] == os.environ.get("OTEL_SERVICE_NAME", "otelgpu.j1")
    assert sorted(os.listdir(out)) == ["gpu_time.rank0.folded"]
    lines = (out / "gpu_time.rank0.folded").read_text().splitlines()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == sum(EXPECTED.values())
    doc = json.loads((tmp_path / "doc.json").read_text())["gpu_time_by_code"]
    assert doc["unit"] == "nanoseconds" and doc["total_per_rank"] == {"0": sum(EXPECTED.values())}
    printed = capsys.readouterr()
    assert "GPU time by launching code" in printed.out and "[nccl]" in printed.out and "nccl:all_reduce" in printed.out


def test_cli_pushes_nothing_for_cpu_only_traces(capsys):
    with Receiver() as rx:
        assert main(["trace", "analyze", "tests/data/traces/cpu_gloo_clean", "--quiet", "--push", rx.url]) == 0
        assert rx.requests == 0
    assert "nothing pushed to Pyroscope: no GPU time in the traces" in capsys.readouterr().err


def test_cli_push_failure_and_bad_flags(tmp_path, capsys):
    crafted(str(tmp_path / "r0.json"))
    with Receiver(mode="error") as rx:
        assert main(["trace", "analyze", str(tmp_path), "--quiet", "--push", rx.url]) == 1
    assert "cannot push GPU time to Pyroscope" in capsys.readouterr().err
    for bad in (["--push", "ftp://x"], ["--job", "j"], ["--service-name", "a\x1bb", "--push", "http://127.0.0.1:9"],
                ["--folded", str(tmp_path / "r0.json")]):
        try:
            rc = main(["trace", "analyze", str(tmp_path), *bad])
        except SystemExit as e:   # argparse refuses a flag's value; a combination is refused after parsing
            rc = e.code
        assert rc == 2, bad
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) <= 2 and ("--" in err), err
    assert not os.path.exists(tmp_path / "folded")


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.lists(st.text(max_size=12), min_size=1, max_size=5).map(tuple),
                       st.integers(min_value=0, max_value=10**15), max_size=8))
def test_folded_lines_read_back_whatever_the_names(raw):
    """Names from a trace (any text) never break the folded format: one line per stack with time, its
    frames split back by ';', its value after the last space."""
    stacks = {}
    for s, ns in raw.items():
        key = tuple(frame(f) for f in s)
        stacks[key] = stacks.get(key, 0) + ns
    lines = folded_text(stacks).splitlines()
    assert len(lines) == sum(1 for ns in stacks.values() if ns > 0)
    for line in lines:
        text, value = line.rsplit(" ", 1)
        assert stacks[tuple(text.split(";"))] == int(value) and line.isprintable()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=250))
def test_label_and_url_flags_accept_or_refuse_in_one_line(text):
    for parse in (_label, _push_url):
        try:
            got = parse(text)
        except argparse.ArgumentTypeError as exc:
            assert "\n" not in str(exc)
            continue
        assert got.strip() and got.isprintable()
