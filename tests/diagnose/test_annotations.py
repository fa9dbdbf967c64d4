"""Findings as Grafana annotations: the payloads (pure), and the HTTP calls against a local recorder
(no Grafana server can run here: what Grafana does with them is not verified)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from otel_gpu.diagnose import Report
from otel_gpu.diagnose.annotations import AnnotationError, annotation_payloads, post_annotations
from otel_gpu.diagnose.findings import Finding, missing_input

from .windows import T0, window


def report_dict():
    f = Finding("checkpoint", "checkpoints take 12.0% of the time", "critical", "high", "rank 0 <saw> it", "why",
                "save async", lost_s=10, ranges=[(T0 + 10, T0 + 20), (T0 + 70, T0 + 80)])
    g = Finding("sm_idle", "SMs idle", "warning", "high", "seen", "why", "act", lost_s=5)
    return Report(window(), [f, g, missing_input("comm", "Comm", "needs profiles", ["profiles"])]).as_dict()


def test_payloads_one_per_range_window_when_none_missing_left_out():
    p = annotation_payloads(report_dict(), dashboard_uid="abc")
    assert len(p) == 3
    assert p[0]["time"] == int((T0 + 10) * 1000) and p[0]["timeEnd"] == int((T0 + 20) * 1000)
    assert p[0]["tags"] == ["otel-gpu", "diagnose", "checkpoint", "critical", "job:j"]
    assert "&lt;saw&gt;" in p[0]["text"] and p[0]["dashboardUID"] == "abc"
    assert (p[2]["time"], p[2]["timeEnd"]) == (int(T0 * 1000), int((T0 + 120) * 1000))   # the whole window


class Recorder:
    """Records POST /api/annotations bodies and headers; answers `status`."""

    def __init__(self, status: int = 200):
        self.bodies, self.auth, self.status = [], [], status
        rec = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                rec.bodies.append(json.loads(body))
                rec.auth.append(self.headers.get("Authorization"))
                out = json.dumps({"id": len(rec.bodies), "message": "Annotation added" if rec.status == 200 else "denied"}).encode()
                self.send_response(rec.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_post_with_bearer_token_and_errors_in_one_line():
    rec = Recorder()
    try:
        payloads = annotation_payloads(report_dict())
        assert post_annotations(rec.url, "tok", payloads) == 3
        assert rec.bodies == payloads and rec.auth == ["Bearer tok"] * 3
    finally:
        rec.close()
    denied = Recorder(status=401)
    try:
        with pytest.raises(AnnotationError) as e:
            post_annotations(denied.url + "/", "bad", annotation_payloads(report_dict()))
        assert "HTTP 401" in str(e.value) and "0 of 3 written" in str(e.value) and "\n" not in str(e.value)
    finally:
        denied.close()
    with pytest.raises(AnnotationError, match="unreachable"):
        post_annotations("http://127.0.0.1:9", "t", annotation_payloads(report_dict()), timeout=2)


@pytest.mark.slow
def test_cli_writes_annotations(backfilled, capsys, monkeypatch):
    from otel_gpu.cli import main

    rec = Recorder()
    try:
        j = backfilled.synth
        monkeypatch.setenv("OTELGPU_GRAFANA_TOKEN", "env-token")
        rc = main(["diagnose", "--prometheus", backfilled.prometheus.url, "--job", j.job, "--from", str(j.start),
                   "--to", str(j.end), "--grafana", rec.url])
        err = capsys.readouterr().err
        assert rc == 0, err
        assert f" written to {rec.url}" in err
        assert rec.auth and set(rec.auth) == {"Bearer env-token"}
        ck = [b for b in rec.bodies if "checkpoint" in b["tags"]]
        assert len(ck) == 5 and all(j.start * 1000 <= b["time"] < b["timeEnd"] <= j.end * 1000 for b in ck)
    finally:
        rec.close()
