"""Loopback receivers for a recorded run: OTLP/HTTP metrics and Pyroscope pushes, into the store.

One `ThreadingHTTPServer` on 127.0.0.1 answers `POST /v1/metrics` (OTLP/HTTP protobuf, what every
rank's and the node agent's exporter sends) and `POST /push.v1.PusherService/Push` (what the
pyroscope-io agent sends). Handlers decode; one writer thread stores, a request per transaction,
and the sender gets its answer once its data is committed. When the disk is full (or failing) the
request is answered as received, counted in `lost_requests`, and the first such error is kept in
`disk_error` for the run to report once at its end. With `forward_*` set, each body is also
sent on, unchanged, to the collector / Pyroscope the user configured (the recording and the stack
then see the same data).
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from ..http_deadline import deadline_client, request
from . import decode
from .store import DiskError, Writer

log = logging.getLogger("otel_gpu.record")

METRICS_PATH = "/v1/metrics"
PUSH_PATH = "/push.v1.PusherService/Push"
MAX_BODY = 64 << 20   # bytes: larger requests are refused


class Closed(RuntimeError):
    """The run has ended: nothing more is written."""


@dataclass
class Counts:
    metric_requests: int = 0
    points: int = 0
    profile_requests: int = 0
    samples: int = 0
    rejected: int = 0
    forward_failures: int = 0
    lost_requests: int = 0    # not stored: the disk was full or failing (see Receiver.disk_error)


class Receiver:
    """Receives on 127.0.0.1:`port` (0: any free port) and writes into `writer`."""

    def __init__(self, writer: Writer, port: int = 0, forward_metrics: str | None = None,
                 forward_profiles: str | None = None, host: str = "127.0.0.1"):
        self.writer = writer
        self.counts = Counts()
        self.forward_metrics = forward_metrics
        self.forward_profiles = forward_profiles.rstrip("/") + PUSH_PATH if forward_profiles else None
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self.disk_error: DiskError | None = None   # the first full-disk / I/O error; the run reports it at its end
        self._http = deadline_client(10.0) if (forward_metrics or forward_profiles) else None
        self.server = ThreadingHTTPServer((host, port), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_port}"
        self._threads = [threading.Thread(target=self.server.serve_forever, args=(0.05,), name="otelgpu-record-http",
                                         daemon=True),
                         threading.Thread(target=self._write_loop, name="otelgpu-record-writer", daemon=True)]

    def start(self) -> "Receiver":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Stop accepting and write what is queued (the store stays open)."""
        self.server.shutdown()
        self.server.server_close()
        with self._lock:   # a kept-alive connection's handler may still run: it gets a 503 from now on
            self._closed = True
            self._jobs.put(None)
        self._threads[1].join()
        if self._http is not None:
            self._http.close()

    # ---- called from handler threads ----
    def store(self, kind: str, rows) -> None:
        """Queue rows for the writer and wait until they are committed."""
        done = threading.Event()
        box: list = []
        with self._lock:
            if self._closed:
                raise Closed("the recording is closed")
            self._jobs.put((kind, rows, done, box))
        done.wait()
        if box:
            raise box[0]

    def forward(self, url: str, body: bytes, headers: dict[str, str]) -> bool:
        try:
            r = request(self._http, "POST", url, timeout=10.0, content=body, headers=headers)
            ok = r.status_code < 300
        except httpx.HTTPError:
            ok = False
        if not ok:
            self.counts.forward_failures += 1
        return ok

    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            kind, rows, done, box = job
            try:
                if kind == "points":
                    self.counts.points += self.writer.add_points(rows)
                    self.counts.metric_requests += 1
                else:
                    self.counts.samples += self.writer.add_profiles(rows)
                    self.counts.profile_requests += 1
            except DiskError as exc:   # kept for the end of the run; later requests still try (space may return)
                self.counts.lost_requests += 1
                if self.disk_error is None:
                    self.disk_error = exc
                box.append(exc)
            except Exception as exc:   # handed to the request's thread, which answers 500
                box.append(exc)
            finally:
                done.set()


def _handler(rx: Receiver):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            try:
                n = int(self.headers.get("content-length") or 0)
            except ValueError:
                n = -1
            if path not in (METRICS_PATH, PUSH_PATH):
                return self._answer(404, b"unknown path")
            if not 0 <= n <= MAX_BODY:
                return self._answer(413, b"body too large")
            raw = self.rfile.read(n)
            try:
                body = decode.decompress(raw, self.headers.get("content-encoding"))
                if path == METRICS_PATH:
                    kind, rows = "points", decode.otlp_points(body)
                else:
                    kind, rows = "profiles", decode.push_profiles(body)
            except decode.DecodeError as exc:
                rx.counts.rejected += 1
                return self._answer(400, str(exc).encode())
            try:
                rx.store(kind, rows)
            except Closed:
                return self._answer(503, b"the recording is closed")
            except DiskError:
                # the run says so once, at its end; the sender cannot help (a retry fills the same disk),
                # so it is not told: no error line per export in the training's output
                pass
            except Exception as exc:
                log.warning("otel-gpu record: cannot write: %s", exc)
                return self._answer(500, b"cannot write")
            fwd = rx.forward_metrics if kind == "points" else rx.forward_profiles
            if fwd:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() in ("content-type", "content-encoding", "x-scope-orgid", "authorization")}
                if not rx.forward(fwd, raw, headers):
                    return self._answer(502, b"recorded; forwarding failed")
            ctype = "application/x-protobuf" if kind == "points" else "application/proto"
            self._answer(200, b"", ctype)

        def _answer(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            return

    return Handler
