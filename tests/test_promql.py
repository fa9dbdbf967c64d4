"""PromClient against real servers: Prometheus, VictoriaMetrics, a dead port, a slow and a wrong one."""

from __future__ import annotations

import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from otel_gpu.promql import PromClient, PromError, Series, format_step, format_time, parse_result
from servers import free_port, wait_until

# -- pure parsing -------------------------------------------------------------------------------


def test_parse_vector_matrix_scalar():
    vec = parse_result(
        {
            "resultType": "vector",
            "result": [
                {"metric": {"__name__": "a", "gpu": "0"}, "value": [100.5, "1.5"]},
                {"metric": {"__name__": "a", "gpu": "1"}, "value": [100.5, "NaN"]},
            ],
        }
    )
    assert vec[0] == Series({"__name__": "a", "gpu": "0"}, [(100.5, 1.5)])
    assert vec[0].name == "a" and vec[0].value == 1.5
    assert math.isnan(vec[1].value)
    mat = parse_result({"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "+Inf"], [2, "-2"]]}]})
    assert mat[0].points == [(1.0, math.inf), (2.0, -2.0)]
    assert parse_result({"resultType": "scalar", "result": [7, "3"]}) == [Series({}, [(7.0, 3.0)])]
    with pytest.raises(ValueError, match="string"):
        parse_result({"resultType": "string", "result": [7, "x"]})


def test_format_time_and_step():
    from datetime import datetime, timezone

    assert format_time(1700000000) == "1700000000.000"
    assert format_time(datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)) == "1700000000.000"
    assert format_step(15) == "15" and format_step(0.5) == "0.5" and format_step("1m") == "1m"
    with pytest.raises(ValueError):
        format_step(0)


# -- a real Prometheus ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scraped(prometheus):
    """A prometheus_client exporter scraped every second by the session Prometheus."""
    registry = CollectorRegistry()
    gauge = Gauge("otelgpu_promql_temp_celsius", "test gauge", ["gpu"], registry=registry)
    gauge.labels("0").set(61.0)
    gauge.labels("1").set(75.0)
    Counter("otelgpu_promql_steps", "test counter", registry=registry).inc(3)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    prometheus.add_scrape_target("promql_test", f"127.0.0.1:{port}")
    client = PromClient(prometheus.url)
    # wait for three scrapes so a range query has several points
    wait_until(
        lambda: client.query('count_over_time(otelgpu_promql_temp_celsius{gpu="0"}[1m]) >= 3'), 15, "3 scrapes"
    )
    client.close()
    yield prometheus
    prometheus.remove_scrape_target("promql_test")
    server.shutdown()
    thread.join(5)


def test_instant_query(scraped):
    with PromClient(scraped.url) as c:
        got = c.query('otelgpu_promql_temp_celsius{job="promql_test"}')
        by_gpu = {s.labels["gpu"]: s.value for s in got}
        assert by_gpu == {"0": 61.0, "1": 75.0}
        assert all(s.name == "otelgpu_promql_temp_celsius" for s in got)
        total = c.query('max(otelgpu_promql_temp_celsius{job="promql_test"}) - 70')
        assert len(total) == 1 and total[0].labels == {} and total[0].value == 5.0
        now = time.time()
        at = c.query("time()", time=now - 100)
        assert at[0].value == pytest.approx(now - 100, abs=0.01)
        assert c.stats.queries == 3 and c.stats.errors == 0
        assert 0 < c.stats.query_seconds <= c.stats.seconds


def test_range_query(scraped):
    with PromClient(scraped.url) as c:
        end = time.time()
        got = c.query_range('otelgpu_promql_temp_celsius{gpu="1"}', end - 3, end, 1)
        assert len(got) == 1
        pts = got[0].points
        assert len(pts) >= 3
        assert all(v == 75.0 for _, v in pts)
        steps = {round(b[0] - a[0], 3) for a, b in zip(pts, pts[1:])}
        assert steps == {1.0}
        assert c.stats.by_endpoint == {"query_range": 1}


def test_series_and_label_values(scraped):
    with PromClient(scraped.url) as c:
        series = c.series('{__name__=~"otelgpu_promql_.*", job="promql_test"}', time.time() - 60, time.time())
        names = {s["__name__"] for s in series}
        assert names == {"otelgpu_promql_temp_celsius", "otelgpu_promql_steps_total", "otelgpu_promql_steps_created"}
        assert c.label_values("gpu", match="otelgpu_promql_temp_celsius") == ["0", "1"]
        assert "promql_test" in c.label_values("job")
        assert c.ready() is True
        assert c.stats.queries == 0 and c.stats.requests == 3  # metadata calls are not queries


def test_bad_promql_names_server_message(prometheus):
    with PromClient(prometheus.url) as c:
        with pytest.raises(PromError) as err:
            c.query("sum(")
        msg = str(err.value)
        assert msg.startswith(f"Prometheus at {prometheus.url} rejected /api/v1/query: bad_data:")
        assert "parse error" in msg
        assert "\n" not in msg
        assert c.stats.errors == 1 and c.stats.queries == 1


# -- servers that fail ------------------------------------------------------------------------------


def test_down_server_is_one_line():
    url = f"http://127.0.0.1:{free_port()}"
    c = PromClient(url, timeout=2)
    with pytest.raises(PromError) as err:
        c.query("up")
    assert str(err.value) == f"Prometheus at {url} is unreachable: connection refused"
    assert c.ready() is False
    assert c.stats.errors == 1


class _Handler(BaseHTTPRequestHandler):
    delay = 0.0  # seconds before answering

    def _answer(self):
        time.sleep(self.delay)
        body = b"<html>not an API</html>"
        try:
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client under test gave up waiting, as it should

    do_GET = do_POST = _answer

    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture
def http_server():
    """Start a local HTTP server with a given handler delay; yields a starter."""
    started = []

    def start(delay: float) -> str:
        handler = type("H", (_Handler,), {"delay": delay})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def test_slow_server_times_out(http_server):
    url = http_server(delay=3.0)
    c = PromClient(url, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(PromError) as err:
        c.query_range("up", 0, 10, 1)
    assert time.monotonic() - t0 < 2.5
    assert str(err.value) == f"Prometheus at {url} did not answer within 0.3 s (/api/v1/query_range)"
    assert c.stats.errors == 1


def test_non_api_server_is_one_line(http_server):
    url = http_server(delay=0)
    with PromClient(url) as c, pytest.raises(PromError) as err:
        c.query("up")
    assert str(err.value) == (
        f"Prometheus at {url} answered /api/v1/query with HTTP 404, not JSON: <html>not an API</html>"
    )


def test_shared_httpx_client_is_not_closed(prometheus):
    with httpx.Client(timeout=5) as shared:
        with PromClient(prometheus.url, client=shared) as c:
            assert c.query("vector(2)")[0].value == 2.0
        assert not shared.is_closed


# -- the same client against VictoriaMetrics --------------------------------------------------------


def test_a_sample_written_this_second_is_returned_at_once(victoriametrics):
    """VictoriaMetrics' own default query time is its now rounded down to the second: the client
    sends its exact now, so a run's final export is seen as soon as it is flushed."""
    while not 0.3 <= time.time() % 1 < 0.6:   # well inside a second: rounding down would hide it
        time.sleep(0.02)
    written = time.time()
    line = f'otelgpu_vm_fresh_ratio{{run="{written}"}} 0.25 {int(written * 1000)}\n'
    assert httpx.post(f"{victoriametrics.url}/api/v1/import/prometheus", content=line, timeout=10).status_code == 204
    victoriametrics.flush()
    with PromClient(victoriametrics.url) as c:
        got = c.query(f'otelgpu_vm_fresh_ratio{{run="{written}"}}')
    if time.time() - written >= 1:
        pytest.skip("the flush took over a second: rounding down would not hide the sample any more")
    assert [s.value for s in got] == [0.25]


def test_victoriametrics_same_api(victoriametrics):
    now = int(time.time())
    lines = "".join(f'otelgpu_vm_util_ratio{{gpu="{g}"}} {v} {(now - 2) * 1000}\n' for g, v in (("0", 0.5), ("1", 0.9)))
    r = httpx.post(f"{victoriametrics.url}/api/v1/import/prometheus", content=lines, timeout=10)
    assert r.status_code == 204
    victoriametrics.flush()
    with PromClient(victoriametrics.url, name="VictoriaMetrics") as c:
        got = wait_until(lambda: c.query("otelgpu_vm_util_ratio"), 5, "imported series queryable")
        assert {s.labels["gpu"]: s.value for s in got} == {"0": 0.5, "1": 0.9}
        avg = c.query_range("avg(otelgpu_vm_util_ratio)", now - 2, now - 2, 1)
        assert avg[0].points == [(float(now - 2), pytest.approx(0.7))]
        assert c.label_values("gpu", match="otelgpu_vm_util_ratio") == ["0", "1"]
        assert len(c.series("otelgpu_vm_util_ratio", now - 60, now)) == 2
        assert c.ready() is True
        with pytest.raises(PromError, match=r"^VictoriaMetrics at http://127\.0\.0\.1:\d+ rejected /api/v1/query: "):
            c.query("sum(")
