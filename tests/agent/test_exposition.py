"""The scrape endpoint's text, checked by promtool (the Prometheus text-format parser and linter)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from otel_gpu import names
from otel_gpu.agent.exposition import Renderer

PROMTOOL = shutil.which("promtool")
GPU = ((names.HW_ID, "GPU-0"), (names.HW_NAME, 'H100 "SXM" 50%r\nbis'))


class Family:
    """A family whose (values, keys) columns a test sets directly."""

    def __init__(self):
        self.values, self.keys = [], ()

    def __call__(self):
        return self.values, self.keys


def promtool_check(text: str) -> None:
    if PROMTOOL is None:
        pytest.skip("promtool not installed (Debian package prometheus; .ci/install.sh installs it)")
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


def samples(text: str) -> dict[str, str]:
    """series text -> value text, sample lines only."""
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_values_labels_and_series_changes_render_as_valid_exposition():
    energy, util = Family(), Family()
    families = [(names.GPU_ENERGY, energy), (names.GPU_UTILIZATION, util)]
    renderer = Renderer(families, {names.HOST: "node-1"}, {"service.name": "otel-gpu-agent"})

    energy.values, energy.keys = [123456789012.5], (GPU,)
    util.values, util.keys = [0.123456789], (GPU + ((names.GPU_TASK, "general"),),)
    first = renderer.render().decode()
    promtool_check(first)
    got = samples(first)
    escaped = 'hw_name="H100 \\"SXM\\" 50%r\\nbis"'
    (energy_line,) = [k for k in got if k.startswith("hw_energy_joules_total{")]
    assert escaped in energy_line and 'host_name="node-1"' in energy_line
    assert got[energy_line] == "123456789012.5"                   # counters exact
    (util_line,) = [k for k in got if k.startswith("hw_gpu_utilization_ratio{")]
    assert got[util_line] == "0.123457"                          # ratios to 6 significant digits

    # a new series, ints, bools and non-finite values: the template is rebuilt, the text stays valid
    other = ((names.HW_ID, "GPU-1"), (names.HW_NAME, "H100"))
    energy.values, energy.keys = [7, float("nan")], (GPU, other)
    util.values = [True]
    second = renderer.render().decode()
    promtool_check(second)
    got = samples(second)
    assert sorted(v for k, v in got.items() if k.startswith("hw_energy_joules_total{")) == ["7.0", "NaN"]
    assert got[util_line] == "1"
    energy.values = [float("inf"), float("-inf")]
    assert sorted(v for k, v in samples(renderer.render().decode()).items()
                  if k.startswith("hw_energy_joules_total{")) == ["+Inf", "-Inf"]

    energy.values, energy.keys = [], ()                           # absent, never 0
    third = renderer.render().decode()
    assert "hw_energy_joules_total" not in third and "target_info" in third


def test_the_endpoint_keeps_the_connection_alive_and_answers_404_elsewhere():
    import http.client

    from otel_gpu.agent.exposition import ScrapeEndpoint

    body = b"# TYPE x gauge\nx 1.0\n" * 500
    endpoint = ScrapeEndpoint(lambda: body, 0)
    try:
        conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=10)
        for _ in range(3):   # as Prometheus does, gzip asked for: served plain (CPU over bytes)
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read() == body and resp.getheader("Content-Encoding") is None
            assert not resp.will_close   # HTTP/1.1 keep-alive: one connection, one server thread
        conn.request("GET", "/other")
        assert conn.getresponse().status == 404
    finally:
        endpoint.close()


def _exchange(port: int, request: bytes) -> tuple[bytes, bool]:
    """(response bytes, whether the server closed the connection after it)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        s.settimeout(0.5)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            return out, False
        return out, True


@pytest.mark.parametrize("request_bytes, status, closed", [
    (b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", b"200", False),
    (b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n\r\n", b"200", True),
    (b"GET /metrics HTTP/1.0\r\n\r\n", b"200", True),
    (b"GET /metrics HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", b"200", False),
    (b"hello\r\n\r\n", b"400", True),
    (b"GET /metrics HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", b"431", True),
])
def test_the_request_parser_honours_connection_and_rejects_bad_requests(request_bytes, status, closed):
    from otel_gpu.agent.exposition import ScrapeEndpoint

    endpoint = ScrapeEndpoint(lambda: b"x 1.0\n", 0)
    try:
        response, was_closed = _exchange(endpoint.port, request_bytes)
        assert response.split(b" ", 2)[1] == status, response[:80]
        assert was_closed == closed
        if status == b"200":
            assert response.endswith(b"\r\n\r\nx 1.0\n")
    finally:
        endpoint.close()
