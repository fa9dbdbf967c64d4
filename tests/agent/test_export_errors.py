"""A collector that is down or comes back: the node agent says so in one line each (when the failure
begins, when its reason changes, at most once a minute while it lasts, when exports work again),
never with the OpenTelemetry SDK's multi-line retry messages; which reasons the exporter's log records
give (Hypothesis: any record gives a short line, never an exception)."""
from __future__ import annotations

import http.server
import logging
import signal
import subprocess
import sys
import threading
import time

from hypothesis import given, strategies as st

from otel_gpu.export_errors import GAVE_UP, ErrorLines, LastReason, probe, reason_of
from tests.childenv import clean_env
from tests.servers import free_port

REFUSED = ("HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: /v1/metrics (Caused by "
           "NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=9): Failed to establish a new connection: "
           "[Errno 111] Connection refused\"))")


def _record(msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord("opentelemetry.exporter.otlp.proto.http.metric_exporter", logging.WARNING, "x", 1, msg,
                             args, None)


def test_reasons_from_the_exporters_records():
    retry = _record("Transient error %s encountered while exporting %s batch, retrying in %.2fs.", REFUSED, "metrics", 1.1)
    assert reason_of(retry) == "connection refused"
    assert reason_of(_record("Failed to export %s batch code: %s, reason: %s", "metrics", 503, "Unavailable")) == \
        "HTTP 503 Unavailable"
    gave_up = _record("Failed to export %s batch due to timeout, max retries or shutdown.", "metrics")
    assert reason_of(gave_up) == GAVE_UP
    keep = LastReason()
    keep.emit(retry)
    keep.emit(gave_up)          # the batch's last word says less than the retry before it
    assert keep.reason == "connection refused"


@given(st.text(max_size=200), st.lists(st.one_of(st.text(max_size=80), st.integers(), st.none(), st.floats()),
                                         max_size=4))
def test_any_record_gives_a_short_reason(msg, args):
    reason = reason_of(_record(msg, *args))
    assert isinstance(reason, str) and 0 < len(reason) <= 120 and "\n" not in reason


def test_one_line_per_failure_its_changes_and_its_end():
    said, now = [], [0.0]
    lines = ErrorLines(said.append, "http://c:4318", every_s=60.0, clock=lambda: now[0])
    for t in range(0, 59, 1):   # a failed export every second for a minute: one line
        now[0] = float(t)
        lines.result(False, "connection refused")
    assert len(said) == 1 and said[0].startswith("export to http://c:4318 failed: connection refused;")
    now[0] = 60.0
    lines.result(False, "connection refused")          # a minute on: once more, with the count
    assert said[-1] == ("export to http://c:4318 failed: connection refused (59 failed exports since the last line; "
                        "still retrying)")
    lines.result(False, "HTTP 503")                    # a new reason: at once
    assert said[-1].startswith("export to http://c:4318 failed: HTTP 503;") and len(said) == 3
    lines.result(True)
    lines.result(True)
    assert said[-1].startswith("export to http://c:4318 works again after 61 failed exports") and len(said) == 4


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_agent_says_a_down_collector_in_one_line_and_when_it_is_back():
    port = free_port()
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}", OTEL_METRIC_EXPORT_INTERVAL="200")
    agent = subprocess.Popen([sys.executable, "-m", "otel_gpu", "agent", "--no-live", "--no-gpu", "--interval", "0.1"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    server = None
    try:
        time.sleep(4.0)                                # down: some 15 exports fail
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Ok)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        time.sleep(3.0)                                # back
    finally:
        agent.send_signal(signal.SIGTERM)
        err = agent.communicate(timeout=30)[1]
        if server is not None:
            server.shutdown()
    assert agent.returncode == 0, err
    lines = err.strip().splitlines()
    assert "Transient error" not in err and "Failed to export" not in err and "shutdown can only" not in err, err
    failed = [x for x in lines if "failed:" in x]
    assert failed == [f"otel-gpu agent: export to http://127.0.0.1:{port} failed: connection refused; its readings are "
                      "dropped, counters carry on at the next export that succeeds"], err
    back = [x for x in lines if "works again" in x]
    assert len(back) == 1 and back[0].startswith(f"otel-gpu agent: export to http://127.0.0.1:{port} works again after "), err
    assert len(lines) == 4, err     # the GPU line, the sampling line, these two


def test_a_bare_gave_up_is_explained_by_a_connection_attempt():
    said = []
    lines = ErrorLines(said.append, "http://c:4318", clock=lambda: 0.0, explain=lambda: "connection refused")
    lines.result(False, GAVE_UP)
    lines.result(False, "connection refused")      # the retries' own reason: the same failure, no new line
    lines.result(False, GAVE_UP)
    assert len(said) == 1 and "failed: connection refused;" in said[0]
    quiet = ErrorLines(said.append, "http://c:4318", clock=lambda: 0.0)   # nothing to explain with
    quiet.result(False, None)
    assert said[-1].startswith(f"export to http://c:4318 failed: {GAVE_UP};")


def test_probe_says_why_a_connection_fails():
    port = free_port()
    assert probe(f"http://127.0.0.1:{port}") == "connection refused"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    try:
        assert probe(f"http://127.0.0.1:{server.server_port}/v1/metrics").startswith("the server accepts connections")
    finally:
        server.server_close()
