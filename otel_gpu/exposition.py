"""The agent's Prometheus scrape endpoint, rendered straight from the exported families.

Names are the OTLP-to-Prometheus translation (`MetricSpec.prometheus_name()`), the same
a Collector, Prometheus 3's OTLP receiver or VictoriaMetrics produce, so a dashboard or
rule works on either path. Rendering skips the OTel SDK's per-point aggregation: label
strings are cached per series, so a scrape of ~700 series costs about a millisecond.
"""
from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Mapping


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TYPES = {"gauge": "gauge", "updowncounter": "gauge", "counter": "counter"}


def label_name(key: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    return "_" + name if name[:1].isdigit() else name


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(v: float) -> str:
    text = repr(float(v))
    return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}.get(text, text)


class Renderer:
    """Renders families to the Prometheus text format, caching each series' label string."""

    def __init__(self, families, point_attrs: Mapping[str, str], resource: Mapping[str, str]):
        self._families = families
        self._point = tuple(sorted(point_attrs.items()))
        self._labels: dict = {}
        info = ",".join(f'{label_name(k)}="{_escape(str(v))}"' for k, v in sorted(resource.items()))
        self._header = ("# HELP target_info Target metadata\n# TYPE target_info gauge\n"
                        f"target_info{{{info}}} 1\n")
        self._meta = {spec.name: (spec.prometheus_name(),
                                  f"# HELP {spec.prometheus_name()} {_help(spec.description)}\n"
                                  f"# TYPE {spec.prometheus_name()} {_TYPES[spec.kind]}\n")
                      for spec, _ in families}

    def _label_string(self, key) -> str:
        text = self._labels.get(key)
        if text is None:
            merged = dict(self._point)
            merged.update(key)
            text = "{" + ",".join(f'{label_name(k)}="{_escape(str(v))}"' for k, v in sorted(merged.items())) + "}"
            if len(self._labels) > 50_000:   # series churn (processes come and go): start over
                self._labels.clear()
            self._labels[key] = text
        return text

    def render(self) -> bytes:
        parts = [self._header]
        for spec, values in self._families:
            rows = values()
            if not rows:
                continue   # absent, never 0
            name, meta = self._meta[spec.name]
            parts.append(meta)
            parts.extend(f"{name}{self._label_string(key)} {format_value(v)}\n" for v, key in rows)
        return "".join(parts).encode()


class ScrapeEndpoint:
    """Serves `render()` at /metrics on host:port (127.0.0.1 unless told otherwise)."""

    def __init__(self, render: Callable[[], bytes], port: int, host: str = "127.0.0.1"):
        class Handler(BaseHTTPRequestHandler):
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
        self._thread = threading.Thread(target=self._server.serve_forever, name="otelgpu-scrape", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

