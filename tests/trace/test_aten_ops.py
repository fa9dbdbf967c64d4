"""The ATen-op table: the deepest-wrapping-op search against a brute force on random intervals, and the
array grouping of op instances against the row-per-launch one (HTA's way, kept for parity tests)."""
import os

import numpy as np
import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from otel_gpu.trace import aten_ops
from otel_gpu.trace.aten_ops import deepest_wrapping
from otel_gpu.trace.model import load_set
from tests.shared_data import reason, shared_data
from tests.trace.kineto import Builder


def brute(op_ts, op_end, start, end):
    """HTA's rule: of the ops with ts <= start and end >= end, the latest start; among equal
    starts the first in (row) order."""
    match = [i for i in range(len(op_ts)) if op_ts[i] <= start and op_end[i] >= end]
    if not match:
        return -1
    best = max(op_ts[i] for i in match)
    return min(i for i in match if op_ts[i] == best)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 40)), max_size=40),
       st.lists(st.tuples(st.integers(0, 70), st.integers(0, 10)), min_size=1, max_size=20))
def test_deepest_wrapping_matches_brute_force(ops, calls):
    ops = sorted(ops, key=lambda o: o[0])  # sorted by start; ties keep their (row) order
    op_ts = np.array([o[0] for o in ops], dtype=np.float64)
    op_end = np.array([o[0] + o[1] for o in ops], dtype=np.float64)
    starts = np.array([c[0] for c in calls], dtype=np.float64)
    ends = starts + np.array([c[1] for c in calls], dtype=np.float64)
    got = deepest_wrapping(op_ts, op_end, starts, ends).tolist()
    assert got == [brute(op_ts, op_end, s, e) for s, e in zip(starts, ends)]


# --- the array version of the op-instance grouping against the row-per-launch version ---------------


def _both(v):
    return aten_ops.op_instances(v), aten_ops.aten_op_instances(aten_ops.aten_op_launches(v))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["aten::mm", "aten::add", "aten::linear", "aten::copy_"]),
                          st.integers(0, 30), st.integers(1, 20),   # op start, duration (ties on purpose)
                          st.integers(0, 3),                        # launches inside it
                          st.sampled_from(["gemm", "elementwise", "copy"]),
                          st.integers(0, 2)),                       # kernels per launch kept (0, 1 or 2)
                min_size=1, max_size=12))
def test_op_instances_equal_the_row_per_launch_grouping(tmp_path_factory, ops):
    b = Builder()
    for name, start, dur, n_launch, kernel, kernels in ops:
        ext = b.cpu(name, start, dur)
        for j in range(n_launch):
            corr = b.runtime("cudaLaunchKernel", start + j * dur / max(n_launch, 1), 0.5, ext)
            for _ in range(kernels):
                b.events.append({"ph": "X", "cat": "kernel", "name": f"{kernel}_{j}", "pid": 0, "tid": 7,
                                 "ts": start + 40 + j, "dur": 1, "args": {"External id": ext, "device": 0,
                                                                          "stream": 7, "correlation": corr}})
    d = tmp_path_factory.mktemp("ops")
    b.write(str(d / "rank0.json"))
    v = load_set(str(d)).ranks[0]
    fast, rows = _both(v)
    target(len(rows))   # steer towards traces with many instances (an empty table on both sides proves little)
    assert fast == rows
    if any(n_launch and kernels == 1 for _, _, _, n_launch, _, kernels in ops):
        assert rows   # a launch with one kept kernel inside its op makes an instance


@pytest.mark.parametrize("name", ["hta_sampled_2rank", "hta_nccl_data", "hta_ns_resolution_single_rank"])
def test_op_instances_equal_the_row_per_launch_grouping_on_shared_sets(name):
    d = shared_data("traces", name)
    if not os.path.isdir(d):
        pytest.skip(reason("traces", name))
    for v in load_set(d).ranks.values():
        fast, rows = _both(v)
        assert fast == rows and len(fast) > 0
