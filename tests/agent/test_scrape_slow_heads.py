"""The scrape endpoint against clients that drip their request head: 300 of them do not lock out a
real scrape (they did; 100 did not), and an empty OTELGPU_PROMETHEUS_HOST is the loopback default,
never every interface."""
from __future__ import annotations

import http.client
import socket
import time

import pytest

from otel_gpu.agent.exposition import ScrapeEndpoint

SLOW = 300


def _scrape(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().status
    finally:
        conn.close()


def test_connections_dripping_their_head_do_not_lock_out_scrapes():
    endpoint = ScrapeEndpoint(lambda: b"x 1.0\n", 0)   # the default cap on connections
    socks = []
    try:
        for _ in range(SLOW):
            s = socket.create_connection(("127.0.0.1", endpoint.port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-a: ")   # and never the rest of the head
            socks.append(s)
        time.sleep(1.5)   # past IDLE_AFTER_S: each is now as good as idle
        for _ in range(3):
            t0 = time.monotonic()
            assert _scrape(endpoint.port) == 200
            assert time.monotonic() - t0 < 5
        assert endpoint.refused >= SLOW - 2 * endpoint.max_connections
    finally:
        for s in socks:
            s.close()
        endpoint.close()


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_prometheus_host_is_the_loopback_default(value):
    import argparse

    from otel_gpu.agent import cli as agent_cli

    parser = argparse.ArgumentParser(prog="otel-gpu")
    agent_cli.register(parser.add_subparsers(dest="subcommand"))
    args = parser.parse_args(["agent", "--no-live", "--prometheus-port", "9999", "--no-gpu"])
    config = agent_cli.agent_config(args, {"OTELGPU_PROMETHEUS_HOST": value}, stdout_is_tty=False)
    assert config.prometheus_host == "127.0.0.1"
