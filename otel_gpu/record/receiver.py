"""Loopback receivers for a recorded run: OTLP/HTTP metrics and Pyroscope pushes, into the store.

One `ThreadingHTTPServer` on 127.0.0.1 answers `POST /v1/metrics` (OTLP/HTTP protobuf, what every
rank's and the node agent's exporter sends) and `POST /push.v1.PusherService/Push` (what the
pyroscope-io agent sends). Handlers decode; one writer thread stores, a request per transaction,
and the sender gets its answer once its data is committed. When the disk is full (or failing) the
request is answered as received, counted in `lost_requests`, and the first such error is kept in
`disk_error` for the run to report once at its end. With `forward_*` set, each body is also
sent on, unchanged, to the collector / Pyroscope the user configured (the recording and the stack
then see the same data).

Any local process can connect, so nothing a client sends may cost the run without a bound:
- with `key` (a per-run secret `otel-gpu run` gives its ranks and node agent in their environment,
  never in a file), a request without it in the `x-otelgpu-key` header is refused 401 before its
  body is read, and nothing of it is recorded;
- a body is at most MAX_BODY bytes as sent, and what it holds is bounded by `decode.Limits`
  (inflated size, messages, points, frames); past a bound the request is refused 413 and one line
  names the bound (once per bound; later ones are counted);
- bodies read at once are at most BODIES_IN_FLIGHT bytes in all (a request waits for room, 503
  after a while), and one request at a time is decoded and written: what decoding costs is paid
  once, not per connection;
- at most MAX_CONNECTIONS connections are served at once (more wait in the listen backlog of
  LISTEN_BACKLOG); a connection silent for IDLE_S, or whose request head or body takes longer than
  REQUEST_S, is closed;
- a client that resets its connection costs a count (`resets`), never a traceback.
The store bounds what the whole run may add (store.RunLimits). So `run`'s memory stays within
its own and these bounds (docs/record.md has the figure measured under attack bodies).
"""
from __future__ import annotations

import hmac
import io
import logging
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import httpx

from ..http_deadline import deadline_client, request
from ..inflate import mib
from ..profiling import RECORD_KEY_HEADER
from . import decode
from .store import SERIES_BOUND, STACK_BOUND, DiskError, Writer

log = logging.getLogger("otel_gpu.record")

METRICS_PATH = "/v1/metrics"
PUSH_PATH = "/push.v1.PusherService/Push"
MAX_BODY = 8 << 20             # bytes: a larger request (as sent) is refused
BODIES_IN_FLIGHT = 32 << 20    # bytes of bodies read at once, all connections together
ROOM_WAIT_S = 10.0             # how long a request waits for that room before a 503
MAX_CONNECTIONS = 128          # served at once; more wait in the backlog
LISTEN_BACKLOG = 1024          # connects the kernel queues (capped by net.core.somaxconn)
IDLE_S = 60.0                  # a kept-alive connection silent this long is closed
REQUEST_S = 30.0               # a request's head, and then its body, must arrive within this


class Closed(RuntimeError):
    """The run has ended: nothing more is written."""


@dataclass
class Counts:
    metric_requests: int = 0
    points: int = 0
    profile_requests: int = 0
    samples: int = 0
    rejected: int = 0         # malformed, or past a bound of decode.Limits
    unauthorized: int = 0     # without the run's key: refused, nothing read
    resets: int = 0           # connections the client reset or that timed out mid-request
    forward_failures: int = 0
    lost_requests: int = 0    # not stored: the disk was full or failing (see Receiver.disk_error)
    bounds: dict = field(default_factory=dict)   # bound named -> requests it refused (or items it dropped)


class Receiver:
    """Receives on 127.0.0.1:`port` (0: any free port) and writes into `writer`; with `key`, only
    requests carrying it. `say` prints one line for the person running the command."""

    def __init__(self, writer: Writer, port: int = 0, forward_metrics: str | None = None,
                 forward_profiles: str | None = None, host: str = "127.0.0.1", key: str | None = None,
                 limits: decode.Limits = decode.LIMITS, say: Callable[[str], None] | None = None):
        self.writer = writer
        self.counts = Counts()
        self.key = key.encode() if key else None
        self.limits = limits
        self.say = say or _say
        self._said: set[str] = set()
        self._room = threading.Condition()
        self._in_flight = 0                   # body bytes being read or held
        self._decoding = threading.Lock()     # one request decoded and written at a time
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.stopping = False
        self.forward_metrics = forward_metrics
        self.forward_profiles = forward_profiles.rstrip("/") + PUSH_PATH if forward_profiles else None
        self.forwarded: dict[str, tuple[int, int, str | None]] = {}   # url -> (tried, failed, first failure's reason)
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self.disk_error: DiskError | None = None   # the first full-disk / I/O error; the run reports it at its end
        self._http = deadline_client(10.0) if (forward_metrics or forward_profiles) else None
        self.server = _Server((host, port), _handler(self), self)
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
        self.stopping = True
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

    def slot(self) -> bool:
        """One of MAX_CONNECTIONS, waited for at most 0.2 s (the accept loop then checks `stopping`)."""
        return self._slots.acquire(timeout=0.2)

    def free_slot(self) -> None:
        self._slots.release()

    def once(self, topic: str, line: str) -> None:
        """Say `line` the first time `topic` comes up in this run."""
        with self._lock:
            if topic in self._said:
                return
            self._said.add(topic)
        self.say(line)

    def refused(self, bound: str) -> None:
        """A request (or items of one) turned away by `bound`: counted, said once."""
        with self._lock:
            self.counts.bounds[bound] = self.counts.bounds.get(bound, 0) + 1
        self.once(bound, f"refused a request to the recording: {bound}; the run goes on (later ones are counted)")

    def authorized(self, given: str | None) -> bool:
        return self.key is None or (given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), self.key))

    def room(self, n: int) -> bool:
        """Reserve `n` bytes of BODIES_IN_FLIGHT (waits up to ROOM_WAIT_S); `release(n)` after."""
        deadline = time.monotonic() + ROOM_WAIT_S
        with self._room:
            while self._in_flight + n > BODIES_IN_FLIGHT:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._room.wait(left)
            self._in_flight += n
            return True

    def release(self, n: int) -> None:
        with self._room:
            self._in_flight -= n
            self._room.notify_all()

    def decode_and_store(self, path: str, raw: bytes, encoding: str | None) -> str:
        """Decode one body and wait until it is committed; returns its kind. One at a time."""
        with self._decoding:
            body = decode.decompress(raw, encoding, self.limits.inflated)
            if path == METRICS_PATH:
                kind, rows = "points", decode.otlp_points(body, self.limits)
            else:
                kind, rows = "profiles", decode.push_profiles(body, self.limits)
            del body
            over = dict(self.writer.over)
            try:
                self.store(kind, rows)
            finally:
                del rows
                for bound, what in ((SERIES_BOUND, "the recording's bound on series was reached: points of new "
                                                   "series are not recorded"),
                                    (STACK_BOUND, "the recording's bound on stack text was reached: new stacks "
                                                  "are recorded as one placeholder")):
                    if self.writer.over.get(bound, 0) > over.get(bound, 0):
                        self.refused(what)
            return kind

    def forward(self, url: str, body: bytes, headers: dict[str, str]) -> bool:
        why = None
        try:
            r = request(self._http, "POST", url, timeout=10.0, content=body, headers=headers)
            if r.status_code >= 300:
                why = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            why = forward_error(exc)
        with self._lock:   # handlers run on threads of their own
            sent, failed, first = self.forwarded.get(url, (0, 0, None))
            self.forwarded[url] = (sent + 1, failed + (why is not None), first or why)
        if why is not None:
            self.counts.forward_failures += 1
        return why is None

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


def _say(line: str) -> None:
    print(f"otel-gpu run: {line}", file=sys.stderr, flush=True)


class _Server(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS served at once (the accept loop waits for a slot: more queue in the
    backlog); a reset or timed-out connection is counted, not printed."""
    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True

    def __init__(self, address, handler, rx: Receiver):
        self.rx = rx
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        while not self.rx.slot():
            if self.rx.stopping:
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except RuntimeError:   # no thread could be started
            self.rx.free_slot()
            self.shutdown_request(request)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.rx.free_slot()

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
            with self.rx._lock:
                self.rx.counts.resets += 1
            self.rx.once("reset", "a connection to the recording was reset or timed out (later ones are counted)")
        else:
            self.rx.once(f"error {type(exc).__name__}", f"a request to the recording failed: {type(exc).__name__}")


class _DeadlineSocketIO(socket.SocketIO):
    """A socket's reads, each given the time left until `deadline` (monotonic seconds)."""
    deadline: float = 0.0

    def readinto(self, b):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long")
        self._sock.settimeout(left)
        return super().readinto(b)


class _Writer(io.BufferedIOBase):
    """Writes to a socket, all of each buffer (`sendall`)."""

    def __init__(self, sock):
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self._sock.sendall(b)
        return len(b)


def forward_error(exc: Exception) -> str:
    """A failed forward's reason in a few words: the OS error where there is one (connection refused,
    name not known), a timeout, else the exception's first line, at most 120 characters."""
    if isinstance(exc, httpx.TimeoutException):
        return "no answer within 10 s"
    cause = exc
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:120]


def _handler(rx: Receiver):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            self.connection = self.request
            self._raw = _DeadlineSocketIO(self.connection, "rb")
            self.rfile = io.BufferedReader(self._raw)
            self.wfile = _Writer(self.connection)
            self.connection.settimeout(REQUEST_S)   # writes

        def finish(self):
            try:
                self.rfile.close()
            finally:
                self.wfile.close()

        def handle_one_request(self):
            self._raw.deadline = time.monotonic() + IDLE_S   # waiting for a request
            try:
                first = self.rfile.peek(1)
            except (TimeoutError, ConnectionError):
                self.close_connection = True
                return
            if not first:
                self.close_connection = True
                return
            self._raw.deadline = time.monotonic() + REQUEST_S   # its head, then its body, within this
            super().handle_one_request()

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            if path not in (METRICS_PATH, PUSH_PATH):
                return self._refuse(404, b"unknown path")
            if not rx.authorized(self.headers.get(RECORD_KEY_HEADER)):
                with rx._lock:
                    rx.counts.unauthorized += 1
                rx.once("key", "refused a request to the recording without the run's key (later ones are counted)")
                return self._refuse(401, b"this recording takes requests from its own run only")
            try:
                n = int(self.headers.get("content-length") or 0)
            except ValueError:
                n = -1
            if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
                return self._refuse(411, b"a content-length is required")
            if not 0 <= n <= MAX_BODY:
                rx.counts.rejected += 1
                rx.refused(f"a body of more than {mib(MAX_BODY)} was sent")
                return self._refuse(413, b"body too large")
            if not rx.room(n):
                return self._refuse(503, b"busy: try again")
            try:
                self._receive(path, n)
            finally:
                rx.release(n)

        def _receive(self, path: str, n: int) -> None:
            raw = self.rfile.read(n)
            if len(raw) < n:
                self.close_connection = True
                return
            self._raw.deadline = time.monotonic() + IDLE_S + REQUEST_S   # decoding may wait its turn
            try:
                kind = rx.decode_and_store(path, raw, self.headers.get("content-encoding"))
            except decode.OverLimit as exc:
                rx.counts.rejected += 1
                rx.refused(exc.bound)
                return self._answer(413, str(exc).encode())
            except decode.DecodeError as exc:
                rx.counts.rejected += 1
                return self._answer(400, str(exc).encode())
            except Closed:
                return self._answer(503, b"the recording is closed")
            except DiskError:
                # the run says so once, at its end; the sender cannot help (a retry fills the same disk),
                # so it is not told: no error line per export in the training's output
                kind = "points" if path == METRICS_PATH else "profiles"
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

        def _refuse(self, code: int, body: bytes) -> None:
            """Answer without reading the body, and close the connection (its body is not read)."""
            self.close_connection = True
            self._answer(code, body, close=True)

        def _answer(self, code: int, body: bytes, ctype: str = "text/plain", close: bool = False) -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            if close:
                self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            return

    return Handler

