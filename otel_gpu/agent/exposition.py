"""The agent's Prometheus scrape endpoint, rendered straight from the exported families.

Names are the OTLP-to-Prometheus translation (`MetricSpec.prometheus_name()`), the same
a Collector, Prometheus 3's OTLP receiver or VictoriaMetrics produce, so a dashboard or
rule works on either path. Rendering skips the OTel SDK's per-point aggregation: each
family is a cached %-template filled in one C-level operation, so a scrape of ~470 series
(8 GPUs and the host) costs about a quarter of a millisecond, window statistics included
(bench/bench_scrape.py). No gzip: on a training node CPU is
scarcer than bytes (level-1 gzip of a 100 KB scrape added ~6% to the agent's CPU).
"""
from __future__ import annotations

import errno
import os
import re
import resource
import select
import socket
import socketserver
import threading
import time
from itertools import islice
from math import isfinite
from typing import Callable, Mapping

from .. import names


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MAX_HEADERS, _MAX_LINE = 100, 65537
MAX_CONNECTIONS = 64       # open scrape connections at most (Prometheus keeps one per target)
LISTEN_BACKLOG = 1024      # connects the kernel queues before accept (capped by net.core.somaxconn)
IDLE_TIMEOUT_S = 300       # an idle keep-alive connection is closed after this (seconds)
ACCEPT_RETRY_S = 0.05      # first pause after accept() found no descriptor (doubles to 1 s)
EVICT_BATCH = 16           # idle connections evicted at once when accept() finds no descriptor
IDLE_AFTER_S = 1.0         # a connection silent this long is idle enough to evict for a new one
HEAD_TIMEOUT_S = 10.0      # each read of a request's headers (a scraper sends them all at once)
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
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
                if isfinite(sum(numbers)) or all(map(isfinite, numbers)):   # the sum: one C loop
                    text = cached[1] % numbers
                else:   # Prometheus spells them NaN, +Inf, -Inf
                    text = cached[2] + "".join(f"{s} {_prometheus_float(v)}\n" for s, v in zip(cached[3], numbers))
                cached[4:] = numbers, text
            parts.append(cached[5])
        return "".join(parts).encode()


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_date: list = [0, b""]   # [second, its Date header line], formatted once a second


def _head(length: int, close: bool) -> bytes:
    """The 200 response's status line and headers for a body of `length` bytes."""
    now = int(time.time())
    if _date[0] != now:
        t = time.gmtime(now)   # RFC 9110 IMF-fixdate, English names whatever the locale
        _date[:] = now, (f"Date: {_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
                         f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT\r\n").encode()
    return b"".join((b"HTTP/1.1 200 OK\r\nContent-Type: " + CONTENT_TYPE.encode() + b"\r\n", _date[1],
                     b"Connection: close\r\n" if close else b"",
                     b"Content-Length: %d\r\n\r\n" % length))


def _prometheus_float(v: float) -> str:
    return repr(v) if isfinite(v) else ("NaN" if v != v else ("+Inf" if v > 0 else "-Inf"))


class _Conn:
    """One open connection: its socket, and since when its thread waits for a request
    (None: its thread has not started yet, or it is reading or answering a request)."""

    __slots__ = ("sock", "idle_since", "evicted")

    def __init__(self, sock):
        self.sock, self.idle_since, self.evicted = sock, None, False


class ScrapeEndpoint:
    """Serves `render()` at /metrics on host:port (127.0.0.1 unless told otherwise).

    Built to keep serving under floods and descriptor exhaustion: at most `max_connections`
    are open at once (a new one evicts the connection idle the longest, a connection whose request
    head has taken over IDLE_AFTER_S counting as idle since its first line); when accept() fails
    for lack of descriptors (EMFILE/ENFILE) an idle connection is evicted, or else a spare
    descriptor is given up to accept and close the waiting connection; the listen backlog
    holds a burst of LISTEN_BACKLOG connects. Connections closed unserved are counted in
    `refused` (exported as otelgpu.agent.scrape.refused).
    """

    def __init__(self, render: Callable[[], bytes], port: int, host: str = "127.0.0.1",
                 max_connections: int | None = None):
        endpoint = self

        class Handler(socketserver.StreamRequestHandler):
            """HTTP/1.1 with keep-alive, just what a scrape needs: the request line and the
            Connection header are read, other headers skipped (socketserver, not http.server:
            http.server imports http.client and through it ssl, ~6 MB of the agent's memory)."""
            timeout = IDLE_TIMEOUT_S        # seconds an idle connection may hold its thread
            disable_nagle_algorithm = True  # each answer is one write: sent at once

            def handle(self):
                self.close_connection = False
                while not self.close_connection:
                    self.handle_one_request()

            def handle_one_request(self):
                conn = endpoint._conns.get(self.request)
                if conn is not None:
                    conn.idle_since = time.monotonic()   # waiting for a request: idle
                self.close_connection = True
                try:
                    line = self.rfile.readline(_MAX_LINE)
                except TimeoutError:
                    return   # idle for IDLE_TIMEOUT_S: closed
                if not line:
                    return   # the client closed it
                if conn is not None:   # its head must come within IDLE_AFTER_S, else it may be evicted as idle
                    conn.idle_since = time.monotonic()
                if len(line) >= _MAX_LINE:
                    self.send_error(414, "Request-URI Too Long")
                elif self._head(line):
                    if conn is not None:
                        conn.idle_since = None   # a whole request came: busy until it is answered
                    if self.command == "GET":
                        self.do_GET()
                    else:
                        self.send_error(501, "Unsupported method")
                self.wfile.flush()

            def _head(self, line: bytes) -> bool:
                """`parse_request`, each read of the headers within HEAD_TIMEOUT_S (a scraper sends
                its whole request at once; a client dripping it holds no thread for long)."""
                self.connection.settimeout(HEAD_TIMEOUT_S)
                try:
                    return self.parse_request(line)
                finally:
                    self.connection.settimeout(self.timeout)

            def parse_request(self, line: bytes) -> bool:
                """The request line and the Connection header; False (answered) when malformed."""
                words = line.decode("iso-8859-1").split()
                if len(words) != 3 or not words[2].startswith("HTTP/1."):
                    self.send_error(400, "Bad request line")
                    return False
                self.command, self.path, version = words
                self.close_connection = version == "HTTP/1.0"
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
                    self.send_error(404, "Not Found")
                    return
                body = render()
                # status line, headers and body in one write: one send (with TCP_NODELAY, two sends
                # were two segments and two wake-ups of the scraper for each scrape)
                self.wfile.write(b"".join((_head(len(body), self.close_connection), body)))

            def send_error(self, code: int, reason: str) -> None:
                """A plain-text error answer; the connection is closed after it."""
                self.close_connection = True
                body = f"{code} {reason}\n".encode()
                self.wfile.write(b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n%sContent-Length: %d\r\n\r\n%s"
                                 % (code, reason.encode(), b"Connection: close\r\n" if self.close_connection else b"",
                                    len(body), body))

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            request_queue_size = LISTEN_BACKLOG   # socketserver's default is 5: a burst got SYN retries
            daemon_threads = True

            def shutdown_request(self, request):
                super().shutdown_request(request)   # closes it: its descriptor is free
                endpoint._forget(request)

            def handle_error(self, request, client_address):
                pass   # a client that reset or was evicted mid-reply: nothing to report, no traceback

        self.refused = 0
        self.max_connections = max_connections or default_max_connections()
        self._conns: dict[socket.socket, _Conn] = {}
        self._lock = threading.Condition()
        self._closing = False
        self._spare = _open_spare()
        self._server = Server((host, port), Handler)
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._accept_loop, name="otelgpu-scrape", daemon=True)
        self._thread.start()

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def _accept_loop(self) -> None:
        """Blocks in accept() until close(): unlike `serve_forever`, which polls twice a
        second, an idle endpoint costs no wake-ups. Never returns on an accept error."""
        server, pause, starved_since = self._server, ACCEPT_RETRY_S, None
        while not self._closing:
            try:
                sock, addr = server.socket.accept()
            except OSError as exc:
                if self._closing:
                    return
                if exc.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                    return                         # the listening socket is gone
                if exc.errno not in _OUT_OF_DESCRIPTORS:
                    continue                       # ECONNABORTED, EINTR, EPROTO...: the next one
                now = time.monotonic()
                starved_since = starved_since or now
                starved = now - starved_since >= IDLE_AFTER_S
                # the connection silent the longest (one just accepted may be about to send its
                # request: not before ACCEPT_RETRY_S, unless starved); with none, the spare descriptor
                if (self._evict_idle(IDLE_AFTER_S, EVICT_BATCH)
                        or self._evict_idle(0.0 if starved else ACCEPT_RETRY_S, EVICT_BATCH)):
                    self._wait_released(ACCEPT_RETRY_S)
                elif not (starved and not self._releasing() and self._refuse_with_spare()):
                    time.sleep(pause)              # replies under way free their descriptors soon
                    pause = min(1.0, pause * 2)
                continue
            pause, starved_since = ACCEPT_RETRY_S, None
            if self._spare is None:
                self._spare = _open_spare()
            self._admit(sock, addr)

    def _admit(self, sock, addr) -> None:
        """Serve `sock`; over `max_connections`, first evict a connection silent for IDLE_AFTER_S,
        and over twice that, the one idle the longest (or, with none idle, refuse this one)."""
        if len(self._conns) >= self.max_connections and not self._evict_idle(IDLE_AFTER_S):
            if len(self._conns) >= 2 * self.max_connections and not self._evict_idle(0.0):
                self._close_unserved(sock)   # every connection is mid-reply: this one waits no longer
                return
        with self._lock:
            self._conns[sock] = _Conn(sock)
        try:
            self._server.process_request(sock, addr)   # one thread per connection (kept alive)
        except RuntimeError:   # no thread could be started (process limits)
            self._forget(sock)
            self._close_unserved(sock)

    def _evict_idle(self, at_least_s: float, count: int = 1) -> bool:
        """Shut down the `count` connections silent the longest, if for `at_least_s` seconds and
        with no request waiting in their socket (their threads then close them); False if none."""
        with self._lock:
            since = time.monotonic() - at_least_s
            idle = sorted((c for c in self._conns.values()
                           if c.idle_since is not None and c.idle_since <= since and not c.evicted),
                          key=lambda c: c.idle_since)
            victims = list(islice((c for c in idle if not _request_waiting(c.sock)), count))
            for victim in victims:
                victim.evicted = True         # counted once, even if a reply is under way
            self.refused += len(victims)
        for victim in victims:
            try:
                victim.sock.shutdown(socket.SHUT_RDWR)   # wakes its thread's blocked read
            except OSError:
                pass   # already closed by its thread
        return bool(victims)

    def _refuse_with_spare(self) -> bool:
        """Out of descriptors with nothing to evict: free the spare, accept and close one waiting
        connection (the client sees a close at once instead of hanging), take the spare back."""
        if self._spare is None:
            return False
        os.close(self._spare)
        self._spare = None
        try:
            sock, _ = self._server.socket.accept()
        except OSError:
            self._spare = _open_spare()
            return False
        self._close_unserved(sock)         # first: the spare takes its descriptor back
        self._spare = _open_spare()
        return True

    def _close_unserved(self, sock) -> None:
        self.refused += 1
        try:
            sock.close()
        except OSError:
            pass

    def _forget(self, sock) -> None:
        with self._lock:
            self._conns.pop(sock, None)
            self._lock.notify_all()

    def _releasing(self) -> bool:
        """Whether an evicted connection is still to be closed by its thread."""
        with self._lock:
            return any(c.evicted for c in self._conns.values())

    def _wait_released(self, timeout_s: float) -> None:
        """Wait until some connection's thread has let go of its socket (or `timeout_s`)."""
        with self._lock:
            self._lock.wait(timeout_s)

    def close(self) -> None:
        self._closing = True
        try:
            self._server.socket.shutdown(socket.SHUT_RDWR)   # wakes the blocked accept()
        except OSError:
            pass   # not connected: nothing to wake
        self._thread.join(1.0)
        self._server.server_close()
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass   # already closed by its thread
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None


def default_max_connections() -> int:
    """A quarter of the descriptor limit, between 4 and MAX_CONNECTIONS: the rest stays for the
    agent's own reads (/proc, /sys, NVML) and its OTLP export."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(4, min(MAX_CONNECTIONS, soft // 4))


def _request_waiting(sock) -> bool:
    """Whether bytes (a request) wait unread in `sock`: such a connection is not idle."""
    try:
        poller = select.poll()   # not recv(MSG_PEEK): on a socket with a timeout, that one waits
        poller.register(sock.fileno(), select.POLLIN)
        return any(mask & select.POLLIN for _, mask in poller.poll(0))
    except (OSError, ValueError):
        return False      # closed meanwhile: nothing to serve there


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None
