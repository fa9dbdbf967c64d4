"""`otel-gpu diagnose` end to end: outputs, threshold overrides, and bad input as one line + exit status."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from otel_gpu.cli import main
from otel_gpu.diagnose.cli import parse_duration, parse_time
from otel_gpu.errors import UsageError
from tests.servers import free_port

pytestmark = pytest.mark.slow


def synth_args(b, *extra):
    j = b.synth
    return ["diagnose", "--prometheus", b.prometheus.url, "--job", j.job, "--from", str(j.start), "--to", str(j.end), *extra]


def test_text_json_and_markdown_outputs(backfilled, tmp_path, capsys):
    js, md = tmp_path / "r.json", tmp_path / "r.md"
    assert main(synth_args(backfilled, "--json", str(js), "--markdown", str(md))) == 0
    text = capsys.readouterr().out
    assert text.startswith("otel-gpu diagnose: job synth") and "5 PromQL queries" in text
    assert "1. [CRITICAL]" in text and "rank 5 on node-01 is a straggler" in text
    d = json.loads(js.read_text())
    assert d["job"] == "synth" and d["worst_severity"] == "critical" and d["queries"]["queries"] == 5
    lost = [f["lost_s"] for f in d["findings"] if not f["missing"]]
    assert lost == sorted(lost, reverse=True)                      # ranked by time at stake
    assert {"rule", "seen", "why", "action", "confidence", "lost_share", "basis", "where", "ranges"} <= set(d["findings"][0])
    from otel_gpu.diagnose.report import findings_from_dicts
    back = findings_from_dicts(d["findings"])
    assert [f.title for f in back] == [f["title"] for f in d["findings"]] and back[0].as_dict() == d["findings"][0]
    m = md.read_text()
    assert m.startswith("# otel-gpu diagnosis: synth") and "| 1 | critical |" in m
    assert ("## Not checked" in m) == any(f["missing"] for f in d["findings"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md"]   # no temporary files left


def test_json_to_stdout_and_threshold_override(backfilled, tmp_path, capsys):
    over = tmp_path / "t.toml"
    over.write_text("[checkpoint]\nshare_warning = 0.5\nshare_critical = 0.9\n")
    assert main(synth_args(backfilled, "--json", "-", "--thresholds", str(over))) == 0
    d = json.loads(capsys.readouterr().out)
    (ck,) = [f for f in d["findings"] if f["rule"] == "checkpoint"]
    assert ck["severity"] == "info"
    yml = tmp_path / "t.yaml"
    yml.write_text("checkpoint:\n  share_warning: 0.01\n  share_critical: 0.02\n")
    assert main(synth_args(backfilled, "--json", "-", "--thresholds", str(yml))) == 0
    d = json.loads(capsys.readouterr().out)
    assert [f["severity"] for f in d["findings"] if f["rule"] == "checkpoint"] == ["critical"]


def _run(args):
    return subprocess.run([sys.executable, "-m", "otel_gpu", *args], capture_output=True, text=True, timeout=60)


def test_unreachable_prometheus_one_line_no_file(tmp_path):
    out = tmp_path / "r.json"
    p = _run(["diagnose", "--prometheus", f"http://127.0.0.1:{free_port()}", "--last", "1h", "--json", str(out)])
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "unreachable: connection refused" in p.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_empty_window_and_unknown_job(backfilled):
    b = backfilled
    p = _run(["diagnose", "--prometheus", b.prometheus.url, "--job", "no-such-job", "--last", "10m"])
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert p.stderr.startswith("otel-gpu diagnose: empty window: no otel-gpu series for job 'no-such-job'")


@pytest.mark.parametrize("args, message", [
    (["--last", "soon"], "duration 'soon'"),
    (["--from", "2025-01-02T00:00:00Z", "--to", "2025-01-01T00:00:00Z"], "window is empty"),
    (["--last", "1h", "--from", "now-2h"], "either --last or --from/--to"),
    (["--last", "1h", "--thresholds", "/nonexistent/t.toml"], "cannot read"),
    (["--last", "1h", "--grafana", "http://g:3000"], "needs a token"),
])
def test_bad_flags_exit_2(args, message):
    p = _run(["diagnose", "--prometheus", "http://127.0.0.1:9", *args])
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and message in p.stderr, p.stderr


def test_bad_threshold_file_exit_2(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text("[checkpoint]\nshare_warnign = 0.5\n")
    p = _run(["diagnose", "--prometheus", "http://127.0.0.1:9", "--last", "1h", "--thresholds", str(bad)])
    assert p.returncode == 2 and "unknown key checkpoint.share_warnign" in p.stderr


def test_time_parsing():
    now = 1_700_000_000.0
    assert parse_time("now", now) == now and parse_time("now-1h30m", now) == now - 5400
    assert parse_time("1699990000", now) == 1699990000
    assert parse_time("2023-11-14T22:13:20Z", now) == now == parse_time("2023-11-14T22:13:20", now)
    assert parse_duration("90s") == 90 and parse_duration("2d") == 172800 and parse_duration("15") == 15
    for bad in ("1x", "-5m", "0s", "h"):
        with pytest.raises(UsageError):
            parse_duration(bad)


def test_tune_space_needs_a_zero_finding(backfilled, tmp_path, capsys):
    out = tmp_path / "space.json"
    assert main(synth_args(backfilled, "--tune-space", str(out))) == 0
    assert "no ZeRO communication finding: no tune space written" in capsys.readouterr().err
    assert not out.exists()


def test_without_job_several_jobs_are_named(backfilled, capsys):
    b = backfilled
    rc = main(["diagnose", "--prometheus", b.prometheus.url, "--from", str(b.synth.start), "--to", str(b.synth.end)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    assert "2 jobs have step metrics in the window (clean, synth): pass --job" in err


class _Pyroscope:
    """A server at the Pyroscope URL that answers the render query badly: 500, a hang, or not Pyroscope."""

    def __init__(self, mode: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        release = self.release = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if mode == "hang":
                    release.wait(30)
                    return
                body = b"<html>not pyroscope</html>"
                self.send_response(500 if mode == "500" else 200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode, reason", [("down", "unreachable"), ("500", "HTTP 500"), ("hang", "did not answer within 2 s"),
                                          ("wrong", "without a flame graph")])
def test_pyroscope_failures_still_print_the_metric_findings(backfilled, capsys, mode, reason):
    server = None if mode == "down" else _Pyroscope(mode)
    url = server.url if server else f"http://127.0.0.1:{free_port()}"
    try:
        t0 = time.monotonic()
        assert main(synth_args(backfilled, "--pyroscope", url, "--json", "-", "--timeout", "2")) == 0
        took = time.monotonic() - t0
    finally:
        if server:
            server.close()
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert f"profiles not checked: Pyroscope at {url}" in err and reason in err
    assert any(f["rule"] == "straggler" and f["severity"] == "critical" for f in d["findings"])   # metrics still diagnosed
    assert any(n.startswith("profiles not checked: Pyroscope at") for n in d["notes"])
    assert took < 15, took   # a hanging Pyroscope costs its timeout, not the whole diagnosis
