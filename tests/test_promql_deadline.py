"""One deadline per HTTP request: a loopback server that drips its answer one byte a second cannot
hold a request past its timeout, whether it drips the headers or the body (real sockets)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_gpu import http_deadline
from otel_gpu.diagnose.profiles import PyroscopeError, fetch_pyroscope
from otel_gpu.promql import PromClient, PromError
from tests.childenv import clean_env

BODY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()


def _answer(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class DripServer:
    """Answers every request on 127.0.0.1 with `fast` bytes at once, then one byte a second."""

    def __init__(self, answer: bytes, fast: int):
        self.answer, self.fast = answer, fast
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:   # the socket was closed by stop(): the server is done
                if self.stop.is_set():
                    return
                raise
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)   # the request (it fits one read on loopback)
            try:
                conn.sendall(self.answer[: self.fast])
                for i in range(self.fast, len(self.answer)):
                    if self.stop.wait(1.0):
                        return
                    conn.sendall(self.answer[i: i + 1])
            except OSError:
                return   # the client gave up, as it should

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture(params=["headers", "body"])
def drip(request):
    fast = 0 if request.param == "headers" else len(_answer(BODY)) - len(BODY) + 1
    server = DripServer(_answer(BODY), fast)
    yield server
    server.close()


def test_prom_client_ends_within_its_timeout(drip):
    client = PromClient(drip.url, timeout=2)
    t0 = time.monotonic()
    with pytest.raises(PromError) as err:
        client.query("up")
    took = time.monotonic() - t0
    assert took < 2 + 1, took
    assert str(err.value) == f"Prometheus at {drip.url} did not answer within 2 s (/api/v1/query)"
    assert client.ready() is False
    client.close()


def test_fetch_pyroscope_ends_within_its_timeout(drip):
    t0 = time.monotonic()
    with pytest.raises(PyroscopeError) as err:
        fetch_pyroscope(drip.url, "otelgpu.train", 0, 60, timeout=1.5)
    assert time.monotonic() - t0 < 1.5 + 1
    assert str(err.value) == f"Pyroscope at {drip.url} did not answer within 1.5 s"


def test_diagnose_cli_one_line_within_timeout():
    server = DripServer(_answer(BODY), 20)
    try:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "otel_gpu", "diagnose", "--prometheus", server.url,
                               "--timeout", "3", "--last", "5m"], capture_output=True, text=True, timeout=120,
                              env=clean_env())
        took = time.monotonic() - t0
    finally:
        server.close()
    err = proc.stderr.strip()
    assert proc.returncode == 1, (proc.returncode, err)
    assert "Traceback" not in err and err.count("\n") == 0, err
    assert "did not answer within 3 s" in err, err
    # interpreter start-up and imports on a loaded machine come on top of the 3 s request
    assert took < 3 + 1 + 10, took


def test_a_fast_answer_is_read_whole():
    server = DripServer(_answer(BODY), len(_answer(BODY)))
    try:
        with PromClient(server.url, timeout=2) as client:
            assert client.query("up") == []
    finally:
        server.close()


def test_every_transport_gets_the_deadline():
    """httpx has no public hook for the network backend: fail loudly if its internals move."""
    with httpx.Client(timeout=1, mounts={"http://example.invalid": httpx.HTTPTransport()}) as c:
        assert http_deadline.install(c) == 2
        assert http_deadline.install(c) == 2   # idempotent


@given(timeout=st.none() | st.floats(0, 1e6), left=st.floats(-10, -0.01) | st.floats(1, 1e6))
def test_time_left_is_the_smaller_bound(timeout, left):
    token = http_deadline._DEADLINE.set(time.monotonic() + left)
    try:
        if left <= 0:
            with pytest.raises(TimeoutError):
                http_deadline.time_left(timeout, TimeoutError)
            return
        t = http_deadline.time_left(timeout, TimeoutError)
    finally:
        http_deadline._DEADLINE.reset(token)
    assert t is not None and t <= left
    if timeout is not None:
        assert t <= timeout


def test_grafana_annotations_end_within_their_timeout(drip):
    from otel_gpu.diagnose.annotations import AnnotationError, post_annotations

    t0 = time.monotonic()
    with pytest.raises(AnnotationError) as err:
        post_annotations(drip.url, "token", [{"time": 0, "text": "x"}], timeout=1.5)
    assert time.monotonic() - t0 < 1.5 + 1
    assert str(err.value) == f"Grafana at {drip.url} did not answer within 1.5 s (0 of 1 written)"
