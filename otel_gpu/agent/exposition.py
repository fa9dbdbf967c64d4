"""The agent's Prometheus scrape endpoint, rendered straight from the exported families.

Names are the OTLP-to-Prometheus translation (`MetricSpec.prometheus_name()`), the same
a Collector, Prometheus 3's OTLP receiver or VictoriaMetrics produce, so a dashboard or
rule works on either path. Rendering skips the OTel SDK's per-point aggregation: each
family is a cached %-template filled in one C-level operation, so a scrape of ~470 series
(8 GPUs and the host) costs about half a millisecond. No gzip: on a training node CPU is
scarcer than bytes (level-1 gzip of a 100 KB scrape added ~6% to the agent's CPU).
"""
from __future__ import annotations

import re
import socket
import threading
from math import isfinite
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Mapping

from .. import names


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MAX_HEADERS, _MAX_LINE = 100, 65537
_TYPES = {"gauge": "gauge", "updowncounter": "gauge", "counter": "counter"}


def label_name(key: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    return "_" + name if name[:1].isdigit() else name


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def value_format(spec, windowed: bool) -> str:
    """`%r` (exact, shortest) for counts, bytes and other exact values; 6 significant digits
    for ratios and windowed statistics, which are estimates (and cost a third to format)."""
    return "%.6g" if spec.unit == "1" or windowed else "%r"


class Renderer:
    """Renders families to the Prometheus text format.

    Each family's text is a %-template (HELP, TYPE and one line per series with a `%r` or
    `%.6g` where its value goes), rebuilt only when the family's series change; a scrape
    then formats each family in one C-level `%` operation. The series keys come from the store,
    which keeps one key object per live series, so "unchanged" is mostly an identity check.
    """

    def __init__(self, families, point_attrs: Mapping[str, str], resource: Mapping[str, str]):
        self._families = families
        self._point = tuple(sorted(point_attrs.items()))
        self._templates: dict[str, list] = {}   # family -> [keys, %-template, meta, series texts, last values, last text]
        self._companions = {c.name for spec, _ in families if spec.windowed for c in names.windowed_companions(spec)}
        info = ",".join(f'{label_name(k)}="{_escape(str(v))}"' for k, v in sorted(resource.items()))
        self._header = ("# HELP target_info Target metadata\n# TYPE target_info gauge\n"
                        f"target_info{{{info}}} 1\n")
        self._meta = {spec.name: (spec.prometheus_name(),
                                  f"# HELP {spec.prometheus_name()} {_help(spec.description)}\n"
                                  f"# TYPE {spec.prometheus_name()} {_TYPES[spec.kind]}\n")
                      for spec, _ in families}

    def _series(self, name: str, key) -> str:
        """`name{labels}` of one series: the point attributes merged with its key, sorted."""
        merged = dict(self._point)
        merged.update(key)
        return name + "{" + ",".join(f'{label_name(k)}="{_escape(str(v))}"' for k, v in sorted(merged.items())) + "}"

    def render(self) -> bytes:
        parts = [self._header]
        for spec, values in self._families:
            numbers, keys = values()
            if not keys:
                continue   # absent, never 0
            cached = self._templates.get(spec.name)
            if cached is None or cached[0] != keys:
                name, meta = self._meta[spec.name]
                fmt = value_format(spec, spec.windowed or spec.name in self._companions)
                series = [self._series(name, k) for k in keys]
                template = meta.replace("%", "%%") + "".join(f"{s.replace('%', '%%')} {fmt}\n" for s in series)
                cached = self._templates[spec.name] = [keys, template, meta, series, None, ""]
            numbers = tuple(map(float, numbers))   # float(): ints, bools, numpy scalars
            if numbers != cached[4]:   # limits, error counts, clock events: mostly unchanged
                if all(map(isfinite, numbers)):
                    text = cached[1] % numbers
                else:   # Prometheus spells them NaN, +Inf, -Inf
                    text = cached[2] + "".join(f"{s} {_prometheus_float(v)}\n" for s, v in zip(cached[3], numbers))
                cached[4:] = numbers, text
            parts.append(cached[5])
        return "".join(parts).encode()


def _prometheus_float(v: float) -> str:
    return repr(v) if isfinite(v) else ("NaN" if v != v else ("+Inf" if v > 0 else "-Inf"))


class ScrapeEndpoint:
    """Serves `render()` at /metrics on host:port (127.0.0.1 unless told otherwise)."""

    def __init__(self, render: Callable[[], bytes], port: int, host: str = "127.0.0.1"):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive: a scraper reuses one connection and thread
            timeout = 300                   # seconds an idle connection may hold its thread

            def parse_request(self):
                """The request line and the Connection header, without the email package's
                general header parser: a scrape needs nothing else, other headers are skipped."""
                self.command = None   # until the request line parses
                self.requestline = self.raw_requestline.decode("iso-8859-1").rstrip("\r\n")
                words = self.requestline.split()
                if len(words) != 3 or not words[2].startswith("HTTP/1."):
                    self.request_version = "HTTP/1.0"   # send_error reads it; the error closes the connection
                    self.send_error(400, "Bad request line")
                    return False
                self.command, self.path, self.request_version = words
                self.close_connection = words[2] == "HTTP/1.0"
                for _ in range(_MAX_HEADERS):
                    line = self.rfile.readline(_MAX_LINE)
                    if line in (b"\r\n", b"\n", b""):
                        return True
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"connection":
                        token = value.strip().lower()
                        if token in (b"close", b"keep-alive"):
                            self.close_connection = token == b"close"
                self.send_error(431, "Too many headers")
                return False

            def do_GET(self):
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = render()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = host, self._server.server_port
        self._thread = threading.Thread(target=self._accept_loop, name="otelgpu-scrape", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        """Blocks in accept() until close(): unlike `serve_forever`, which polls twice a
        second, an idle endpoint costs no wake-ups."""
        server = self._server
        while True:
            try:
                conn, addr = server.socket.accept()
            except OSError:   # close() shut the socket down
                return
            server.process_request(conn, addr)   # one thread per connection (kept alive)

    def close(self) -> None:
        try:
            self._server.socket.shutdown(socket.SHUT_RDWR)   # wakes the blocked accept()
        except OSError:
            pass   # not connected: nothing to wake
        self._thread.join(1.0)
        self._server.server_close()

