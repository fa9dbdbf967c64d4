"""Anti-patterns on crafted GPU traces (each pattern on and off) and on real PyTorch CPU traces."""
import pytest

from otel_gpu.trace.analyze import Options, analyze
from otel_gpu.trace.findings import Thresholds
from otel_gpu.trace.model import load_set
from kineto import training_trace

PATTERNS = ["many_short_kernels", "too_many_syncs", "unhidden_nccl", "long_gpu_idle", "alloc_thrash",
            "pageable_h2d"]
CHECKED = PATTERNS + ["queue_drain_sync", "gemm_misaligned", "gemm_old_arch", "gemm_fp32"]  # tests/trace/test_findings_*.py
FLAG = {"many_short_kernels": "launch_bound", "too_many_syncs": "syncs", "unhidden_nccl": "unhidden_nccl",
        "long_gpu_idle": "idle", "alloc_thrash": "alloc_thrash", "pageable_h2d": "pageable"}
REAL = "tests/data/traces"


def run(tmp_path, **flags):
    training_trace(0, **flags).write(str(tmp_path / "rank0.json"))
    return analyze(load_set(str(tmp_path)))


def test_clean_trace_has_no_findings(tmp_path):
    doc = run(tmp_path)
    assert doc["findings"] == []
    checks = {c["pattern"]: c for c in doc["checks"]}
    assert set(checks) == set(CHECKED)
    assert checks["too_many_syncs"]["value"] == 1.0  # one sync per step is measured, under the threshold
    assert checks["long_gpu_idle"]["value"] < 5


@pytest.mark.parametrize("pattern", PATTERNS)
def test_each_pattern_present(tmp_path, pattern):
    doc = run(tmp_path, **{FLAG[pattern]: True})
    assert [f["pattern"] for f in doc["findings"]] == [pattern]
    f = doc["findings"][0]
    assert f["ranks"] == [0] and f["fix"] and f["time_at_stake_us"] > 0
    assert f["indicator"]["median"] >= f["indicator"]["threshold"]
    assert f["share_of_span_pct"]["median"] >= doc["thresholds"]["min_time_share_pct"]
    assert f["where"]["steps"] if "steps" in f["where"] else f["where"]["largest_gaps"]


def test_where_names_ops_kernels_and_streams(tmp_path):
    short = run(tmp_path, launch_bound=True)["findings"][0]
    assert short["where"]["kernels"][0][0].startswith("void at::native::vectorized_elementwise_kernel")
    assert short["where"]["ops"] == [["aten::add_", 300]] and short["where"]["streams"] == [7]
    assert short["where"]["steps"] == [1, 2, 3]  # the last step is excluded, as in HTA


def test_unhidden_nccl_time_at_stake(tmp_path):
    f = run(tmp_path, unhidden_nccl=True)["findings"][0]
    assert f["time_at_stake_us"] == pytest.approx(3 * 2500)  # three analysed steps, nothing overlaps
    assert f["where"]["streams"] == [20]


def test_real_cpu_traces_sync_present_and_absent():
    """64 .item() per step on CPU tensors cost ~3 us a step: over the count threshold, nothing at stake,
    so not reported by default; with the time-at-stake threshold at 0 they are, as one finding."""
    default = analyze(load_set(f"{REAL}/cpu_gloo_sync_straggler"))
    assert default["findings"] == []
    checks = [c for c in default["checks"] if c["pattern"] == "too_many_syncs"]
    assert all(c["triggered"] and not c["reported"] and c["share_of_span_pct"] < 1 for c in checks)
    doc = analyze(load_set(f"{REAL}/cpu_gloo_sync_straggler"), Options(thresholds=Thresholds(min_time_share_pct=0)))
    syncs = [f for f in doc["findings"] if f["pattern"] == "too_many_syncs"]
    assert len(syncs) == 1 and syncs[0]["ranks"] == [0, 1]  # one finding for both ranks
    assert syncs[0]["indicator"]["min"] == syncs[0]["indicator"]["max"] == 64  # 64 .item() per step
    assert syncs[0]["where"]["ops"][0][0] == "aten::_local_scalar_dense"
    clean = analyze(load_set(f"{REAL}/cpu_gloo_clean"))
    assert clean["findings"] == []
    assert {c["value"] for c in clean["checks"] if c["pattern"] == "too_many_syncs"} == {0.0}


def test_real_cpu_traces_straggler():
    doc = analyze(load_set(f"{REAL}/cpu_gloo_sync_straggler"))
    cross = doc["cross_rank"]
    assert cross["straggler"]["rank"] == 1  # rank 1 does 4x the matmuls
    assert [s["straggler_rank"] for s in cross["steps"]] == [1, 1, 1]
    assert cross["straggler"]["excess_pct"] > 20
    assert any("no GPU" in n for n in doc["notes"])


def test_ops_behind_rows_most_frequent_first_ties_in_first_seen_order(tmp_path):
    """The ops named in a finding's evidence: counted per op name, the most frequent first, ties in the
    order first seen, "?" for rows whose op is not in the trace (as Counter.most_common over the names)."""
    from collections import Counter

    import numpy as np
    from hypothesis import given, settings, strategies as st

    from otel_gpu.trace.findings import _op_by_external_id, _ops_of
    d = tmp_path / "run"
    d.mkdir()
    training_trace(0).write(str(d / "r0.json"))
    v = load_set(str(d)).ranks[0]
    ops = _op_by_external_id(v)

    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.integers(0, len(v.rows) - 1), max_size=60), st.integers(1, 6))
    def check(picks, top):
        rows = v.rows[np.array(picks, dtype=np.int64)]
        keys, names = ops
        ext = v.ev.external_id[rows]
        j = np.minimum(np.searchsorted(keys, ext), len(keys) - 1)
        found = keys[j] == ext
        ref = Counter(v.names[int(n)] for n in names[j[found]].tolist())
        if (~found).any():
            ref["?"] += int((~found).sum())
        assert _ops_of(v, rows, ops, top) == [[k, n] for k, n in ref.most_common(top)]
    check()
