"""The streaming reader: formats, chunk boundaries, rounding, and clear errors on bad files."""
import gzip
import json
import os

import numpy as np
import pytest

from otel_gpu.trace.parse import TraceFormatError, read_trace
from tests.shared_data import require_shared_data
from kineto import training_trace

REAL = "tests/data/traces/cpu_gloo_sync_straggler/rank1.pt.trace.json.gz"


def _same(a, b):
    for f in ("index", "ts", "dur", "name", "cat", "stream", "correlation", "external_id"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert a.names == b.names and a.rank == b.rank


def test_gzip_plain_and_tiny_chunks_agree(tmp_path):
    b = training_trace(rank=3, short_kernels=True)
    big = read_trace(b.write(str(tmp_path / "t.json.gz")))
    assert big.rank == 3 and len(big) > 1000
    _same(big, read_trace(b.write(str(tmp_path / "t.json"))))
    _same(big, read_trace(str(tmp_path / "t.json"), chunk_chars=7))  # every token split across reads


def test_real_cpu_trace_rank_and_rounding():
    ev = read_trace(REAL)
    assert ev.rank == 1 and ev.ts_rounded  # PyTorch 2.13 writes fractional (ns) timestamps
    assert ev.ts.dtype == np.int64
    assert "ProfilerStep#1" in ev.names


def test_ns_rounding_like_hta(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 10.2, "dur": 0.3, "args": {"stream": 7}},
              {"ph": "X", "cat": "kernel", "name": "k", "ts": 10.5, "dur": 2.75, "args": {"stream": "7"}},
              {"ph": "i", "name": "instant", "ts": 11}]
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"traceEvents": events}))
    ev = read_trace(str(p))
    # ceil start, floor end; the first ends before it starts once rounded: 0 us (HTA: -1 us), counted
    assert ev.ts.tolist() == [11, 11] and ev.dur.tolist() == [0.0, 2.0] and ev.rounded_short == 1
    assert ev.stream.tolist() == [7, 7] and ev.correlation.tolist() == [-1, -1]


def test_bare_array_and_no_rank(tmp_path):
    p = tmp_path / "a.json"
    p.write_text(json.dumps([{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 2}]))
    ev = read_trace(str(p))
    assert ev.rank == 0 and len(ev) == 1


@pytest.mark.parametrize("cut", [0.3, 0.999])
def test_truncated_gzip_names_the_file(tmp_path, cut):
    data = open(REAL, "rb").read()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(TraceFormatError, match="cut.json.gz"):
        read_trace(str(p))


def test_truncated_json_text(tmp_path):
    text = gzip.open(REAL, "rt").read()
    p = tmp_path / "cut.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(TraceFormatError, match=r"cut\.json: truncated"):
        read_trace(str(p))


@pytest.mark.parametrize("content, message", [
    ('{"traceEvents": [{"ph": "X",, }]}', "invalid JSON"),
    ('{"schemaVersion": 1}', "no 'traceEvents'"),
    ('hello', "not a JSON trace"),
    ('{"traceEvents": []} trailing', "extra data"),
])
def test_invalid_files(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TraceFormatError, match=message):
        read_trace(str(p))


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="no such file"):
        read_trace(str(tmp_path / "nope.json"))


def test_legacy_2021_format_fields():
    src = str(require_shared_data("traces", "edge_cases", "kineto_tb_plugin_resnet50"))
    ev = read_trace(os.path.join(src, os.listdir(src)[0]))
    assert "Kernel" in ev.names and "Runtime" in ev.names
    assert (ev.external_id >= 0).sum() > 1000  # legacy "external id" spelling is read too
