"""An API answer is read within a size bound, decompressed as it arrives: a server that sends an
endless body, or a small gzip body that inflates without end, costs one line, not the memory."""
from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import threading
import time
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.promql import PromClient, PromError
from tests.childenv import clean_env

OK = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()


class Server:
    """Answers every request on 127.0.0.1 with `head` and then `body()`'s chunks (chunked encoding)."""

    def __init__(self, body, encoding: str = ""):
        self.body, self.encoding = body, encoding
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn) -> None:
        with conn:
            _read_request(conn)
            enc = f"Content-Encoding: {self.encoding}\r\n".encode() if self.encoding else b""
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + enc
                             + b"Transfer-Encoding: chunked\r\n\r\n")
                for chunk in self.body():
                    if not chunk:
                        continue   # an empty chunk would end the body
                    conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.sent += len(chunk)
                conn.sendall(b"0\r\n\r\n")
            except OSError:
                return   # the client gave up, as it should

    def close(self) -> None:
        self.sock.close()


def _read_request(conn) -> None:
    """The whole request, head and body: a close with unread bytes would send a reset, not the answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            return
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        got = conn.recv(65536)
        if not got:
            return
        body += got


def endless():
    block = b" " * 65536
    while True:
        yield block


def bomb(encoding: str, size: int):
    pack = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    yield pack.compress(OK)
    zeros = b" " * (1 << 20)
    for _ in range(size >> 20):
        yield pack.compress(zeros)
    yield pack.flush()


@pytest.mark.parametrize("make", [lambda: Server(endless), lambda: Server(lambda: bomb("gzip", 256 << 20), "gzip"),
                                  lambda: Server(lambda: bomb("deflate", 256 << 20), "deflate")],
                         ids=["endless", "gzip-bomb", "deflate-bomb"])
def test_an_answer_past_the_bound_is_one_line_and_read_no_further(make):
    server = make()
    try:
        client = PromClient(server.url, timeout=30, max_bytes=4 << 20)
        t0 = time.monotonic()
        with pytest.raises(PromError, match=r"answered /api/v1/query with more than 4 MiB: not read") as e:
            client.query("up")
        assert time.monotonic() - t0 < 10 and "\n" not in str(e.value)
        client.close()
    finally:
        server.close()


@settings(max_examples=30, deadline=None)
@given(size=st.integers(0, 3000), bound=st.integers(100, 2500), encoding=st.sampled_from(["", "gzip", "deflate"]))
def test_an_answer_within_the_bound_is_read_whole_in_any_encoding(size, bound, encoding):
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}, "pad": "x" * size}).encode()
    packed = {"": body, "gzip": gzip.compress(body), "deflate": zlib.compress(body)}[encoding]
    server = Server(lambda: [packed[i:i + 700] for i in range(0, len(packed), 700)], encoding)
    try:
        client = PromClient(server.url, timeout=10, max_bytes=bound)
        if len(body) <= bound:
            assert client.query("up") == []
        else:
            with pytest.raises(PromError, match="more than"):
                client.query("up")
        client.close()
    finally:
        server.close()


def test_diagnose_against_an_endless_answer_is_one_line_within_seconds():
    server = Server(endless)
    try:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "otel_gpu", "diagnose", "--prometheus", server.url, "--job", "j"],
                              env=clean_env(), capture_output=True, text=True, timeout=60)
        assert time.monotonic() - t0 < 30
        assert proc.returncode == 1, proc.stderr
        assert "more than 64 MiB" in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    finally:
        server.close()
