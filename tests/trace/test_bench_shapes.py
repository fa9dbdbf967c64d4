"""The benchmark's generated trace sets: deterministic, read by the analysis as the shapes they claim."""
import os
import sys

import numpy as np
import pytest

from otel_gpu.trace.analyze import Options, analyze
from otel_gpu.trace.launch import launch_pairs
from otel_gpu.trace.model import COMMUNICATION, load_set

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from trace_shapes import SHAPES, rank_document, write_set  # noqa: E402


def test_same_seed_same_document_other_seed_other():
    assert rank_document("nccl", 3, 4, seed=1, steps=2) == rank_document("nccl", 3, 4, seed=1, steps=2)
    assert rank_document("nccl", 3, 4, seed=1, steps=2) != rank_document("nccl", 3, 4, seed=2, steps=2)


def test_unknown_shape_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown shape"):
        write_set("rnn", str(tmp_path))


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_reads_as_its_kind(tmp_path, shape):
    ts = load_set(write_set(shape, str(tmp_path / shape), ranks=2, steps=3), jobs=1)
    assert sorted(ts.ranks) == [0, 1] and ts.steps_filtered   # rank from distributedInfo; last step dropped
    doc = analyze(ts, Options(critical_path=False), jobs=1)
    kinds = {r["kernel_type"]: r["percentage"] for r in doc["kernel_type_breakdown"]}
    assert COMMUNICATION in kinds and "COMPUTATION" in kinds
    for v in ts.ranks.values():
        pairs = launch_pairs(v)
        assert pairs["correlation"].size > 0 and (pairs["launch_delay"] >= 0).all()
    kernels = {r["name"]: r for r in doc["kernel_breakdown"]}
    assert kernels
    if shape == "nccl":   # communication-dominated
        assert kinds[COMMUNICATION] > kinds["COMPUTATION"]
    if shape == "dlrm":   # many tiny kernels: most of the GPU's span idle, waiting for launches
        assert np.median([t["idle_time_pctg"] for t in doc["temporal_breakdown"]]) > 30
