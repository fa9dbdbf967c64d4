"""Every analysis on random small traces that the reader accepts: no exception, strict JSON, and
no impossible figure (shares within 0-100%, no negative time)."""
import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu.trace.analyze import analyze, jsonable
from otel_gpu.trace.diff import diff_sets
from otel_gpu.trace.model import load_set
from otel_gpu.trace.report import csv_files

KERNELS = ["ampere_sgemm_128x64_nn", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
           "Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "void at::native::vectorized_elementwise_kernel<4>"]
CALLS = ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaFree", "hipLaunchKernel"]
OPS = ["aten::mm", "aten::add_", "aten::_local_scalar_dense", "nccl:all_reduce", "aten::copy_"]

_t = st.integers(0, 5000)
_d = st.integers(0, 800)
_corr = st.integers(1, 12)


@st.composite
def trace_events(draw):
    events = []
    for step in range(draw(st.integers(0, 3))):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 1}",
                       "ts": step * 1800, "dur": draw(st.integers(1, 2000))})
    for _ in range(draw(st.integers(0, 12))):
        events.append({"ph": "X", "cat": draw(st.sampled_from(["cpu_op", "gpu_user_annotation", "user_annotation"])),
                       "name": draw(st.sampled_from(OPS)), "ts": draw(_t), "dur": draw(_d),
                       "args": {"External id": draw(st.integers(0, 5))}})
    for _ in range(draw(st.integers(0, 12))):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": draw(st.sampled_from(CALLS)), "ts": draw(_t),
                       "dur": draw(_d), "args": {"correlation": draw(_corr), "External id": draw(st.integers(0, 5))}})
    for _ in range(draw(st.integers(0, 12))):
        name = draw(st.sampled_from(KERNELS))
        args = {"stream": draw(st.sampled_from([0, 7, 20])), "correlation": draw(_corr), "device": 0}
        if name.startswith("Mem"):
            args["memory bandwidth (GB/s)"] = draw(st.floats(0, 1000))
        events.append({"ph": "X", "cat": draw(st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset"])),
                       "name": name, "ts": draw(_t), "dur": draw(st.one_of(_d, st.floats(0, 50))), "args": args})
    if draw(st.booleans()):  # nanosecond-resolution trace
        for e in events:
            e["ts"] = e["ts"] + 0.5
    return events


def _check_figures(doc):
    for t in doc["temporal_breakdown"]:
        for k in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
            assert t[k] is None or -0.01 <= t[k] <= 100.01, (k, t)
        assert t["idle_time_us"] >= 0 and t["compute_time_us"] >= 0 and t["kernel_time_us"] >= 0
    for r in doc["comm_comp_overlap"]:
        assert r["comp_comm_overlap_pctg"] is None or 0 <= r["comp_comm_overlap_pctg"] <= 100
    for r in doc["queue_length_summary"]:
        assert r["min"] >= -len(doc["ranks"]) * 100  # a count of outstanding operations, bounded by the events
    for f in doc["findings"]:
        assert f["time_at_stake_us"] >= 0 and f["share_of_span_pct"]["min"] >= 0
    for c in doc["checks"]:
        assert c["time_at_stake_us"] >= 0 and math.isfinite(c["value"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.lists(trace_events(), min_size=1, max_size=3))
def test_every_analysis_on_random_traces(tmp_path_factory, ranks):
    d = tmp_path_factory.mktemp("run")
    kept = 0
    for r, events in enumerate(ranks):
        if not events:
            events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1}]
        kept += 1
        (d / f"rank{r}.json").write_text(json.dumps({"distributedInfo": {"rank": r}, "traceEvents": events}))
    ts = load_set(str(d))
    doc = analyze(ts)
    clean = jsonable(doc)
    json.dumps(clean, allow_nan=False)  # strict JSON
    _check_figures(clean)
    files = dict(csv_files(doc))
    assert "findings.csv" in files and len(files) >= 10
    diff = diff_sets(ts, ts)
    assert all(r["delta_total_us"] == 0 and r["total_a_us"] >= 0 for r in diff["rows"])
    assert len(ts.ranks) == kept
