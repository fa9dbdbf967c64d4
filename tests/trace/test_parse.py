"""The streaming reader: formats, chunk boundaries, rounding, and clear errors on bad files."""
import gzip
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from otel_gpu.trace import gz
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


def _damaged(data: bytes) -> dict[str, bytes]:
    """The same gzip file cut short, with a flipped byte in its deflate stream, with an invalid deflate
    block (zlib.error / isal's IsalError), with a bad CRC, with garbage after it, and with a gzip
    header but no deflate stream."""
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    return {"truncated": data[: len(data) // 2], "flipped": bytes(flipped),
            "invalid block": data[:10] + b"\xff" * 20 + data[30:],
            "bad crc": data[:-8] + bytes(4) + data[-4:], "trailing garbage": data + b"garbage",
            "header only": data[:10]}


@pytest.mark.parametrize("backend", gz.backends())
def test_gzip_backends_read_the_same_text(backend):
    """Each gzip reader this process has gives the standard library's text, multi-member files too."""
    data = open(REAL, "rb").read()
    want = gzip.decompress(data).decode("utf-8-sig")
    for blob, text in [(data, want), (data + data, want + want)]:
        with gz.open_text(io.BytesIO(blob), backend) as fh:
            assert fh.read() == text


@pytest.mark.parametrize("backend", gz.backends())
@pytest.mark.parametrize("case", list(_damaged(b"\x1f\x8b")))
def test_damaged_gzip_raises_a_read_error(backend, case):
    """A damaged file raises one of READ_ERRORS with either reader: the reader turns it into one
    line naming the file (test_damaged_gzip_is_one_clear_line)."""
    data = _damaged(open(REAL, "rb").read())[case]
    with pytest.raises(gz.READ_ERRORS):
        with gz.open_text(io.BytesIO(data), backend) as fh:
            while fh.read(1 << 16):
                pass


@pytest.mark.parametrize("case", list(_damaged(b"\x1f\x8b")))
def test_damaged_gzip_is_one_clear_line(tmp_path, case):
    p = tmp_path / "bad.json.gz"
    p.write_bytes(_damaged(open(REAL, "rb").read())[case])
    with pytest.raises(TraceFormatError, match=r"bad\.json\.gz: ") as got:
        read_trace(str(p))
    assert "\n" not in str(got.value)


def test_standard_library_gzip_reads_the_same_events(tmp_path):
    """OTELGPU_TRACE_GZIP=zlib (the reader without isal) reads the very events of the default one."""
    out = tmp_path / "events.npz"
    code = ("import sys, numpy as np; from otel_gpu.trace import gz; from otel_gpu.trace.parse import read_trace; "
            "assert gz.GZIP_BACKEND == 'zlib'; e = read_trace(sys.argv[1]); "
            "np.savez(sys.argv[2], ts=e.ts, dur=e.dur, name=e.name, names=np.array(e.names))")
    env = dict(os.environ, OTELGPU_TRACE_GZIP="zlib")
    subprocess.run([sys.executable, "-c", code, REAL, str(out)], check=True, env=env)
    got, ev = np.load(out), read_trace(REAL)
    assert np.array_equal(got["ts"], ev.ts) and np.array_equal(got["dur"], ev.dur)
    assert np.array_equal(got["name"], ev.name) and got["names"].tolist() == ev.names
