"""Failed OTLP exports said in one line each, instead of the OpenTelemetry SDK's log messages.

The SDK's OTLP exporters log every retry ("Transient error ... encountered while exporting metrics
batch, retrying in 1.10s.", a few per export) and every dropped batch ("Failed to export metrics batch
due to timeout, max retries or shutdown.") through `logging`, which prints them on stderr every few
seconds while a collector is down. In a process of ours (the node agent) those loggers are taken over:
their records only keep the latest reason, and `ErrorLines` says a failure in one line when it begins
(where the exporter only said it gave up, a connection attempt says why), when its reason changes, at
most once a `every_s` while it lasts (with how many exports failed), and once when exports succeed again. Pure apart from `take_over` (logging) and the `say` callable.
"""
from __future__ import annotations

import logging
import re
import socket
import time
from typing import Callable
from urllib.parse import urlsplit

# the loggers the OTLP metric exporters (HTTP, gRPC) write their retries and failures to
EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.metric_exporter",
                    "opentelemetry.exporter.otlp.proto.grpc.exporter",
                    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter")
ERRNO = re.compile(r"\[Errno -?\d+\] ([^\"'()\]]+)")
GAVE_UP = "no answer in time, or retries used up"   # the exporter's last word on a batch: says less than a retry's


def reason_of(record: logging.LogRecord) -> str:
    """A few words for what an exporter's log record says went wrong: the OS error (connection refused,
    name or service not known), an HTTP status, a timeout; else its message's start (120 characters)."""
    msg = record.msg if isinstance(record.msg, str) else str(record.msg)
    args = record.args if isinstance(record.args, tuple) else ()
    if msg.startswith("Failed to export") and "code:" in msg and len(args) >= 3 and args[1] is not None:
        return f"HTTP {args[1]}" + (f" {args[2]}" if args[2] else "")
    text = " ".join(str(a) for a in args) if args else ""
    try:
        text = text or record.getMessage()
    except (TypeError, ValueError):   # a record whose arguments do not fit its message
        text = msg
    found = ERRNO.search(text)
    if found:
        return found.group(1).strip().lower()
    if msg.startswith("Failed to export") and "max retries" in msg:
        return GAVE_UP
    if "timed out" in text.lower() or "timeout" in text.lower():
        return "no answer in time"
    return " ".join(text.split())[:120] or "unknown"


class LastReason(logging.Handler):
    """Keeps the reason of the latest warning or error an exporter logged (nothing is printed); the
    exporter's "gave up" never replaces a reason its retries gave. Cleared when an export succeeds."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reason: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        reason = reason_of(record)
        if reason != GAVE_UP or self.reason is None:   # keep what the retries said
            self.reason = reason


def take_over(names: tuple[str, ...] = EXPORTER_LOGGERS) -> LastReason:
    """Route the exporters' loggers to one `LastReason` and nowhere else (not stderr)."""
    handler = LastReason()
    for name in names:
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.propagate = False
    return handler


def unreachable(endpoint: str, timeout_s: float = 1.0) -> str | None:
    """Why a TCP connection to `endpoint` (an http(s) URL) fails, in a few words; None when it opens."""
    url = urlsplit(endpoint)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return None
    except socket.timeout:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return (exc.strerror or str(exc) or type(exc).__name__).lower()[:120]
    except ValueError as exc:   # a port out of range
        return str(exc)[:120]


def probe(endpoint: str, timeout_s: float = 1.0) -> str:
    """Why exports to `endpoint` fail, as far as a connection attempt tells."""
    return unreachable(endpoint, timeout_s) or ("the server accepts connections but the export failed (no answer "
                                                "in time, or an error answer)")


class ErrorLines:
    """Which export results are said, in one line each, to `say` (see the module doc)."""

    def __init__(self, say: Callable[[str], None], endpoint: str, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, explain: Callable[[], str | None] | None = None):
        """`explain`: asked for a reason when a failure begins and the exporter gave none (`probe`)."""
        self.say, self.endpoint, self.every_s, self.clock, self.explain = say, endpoint, every_s, clock, explain
        self.reason: str | None = None     # the failure going on, None while exports succeed
        self.failed = 0                    # exports failed since the failure began
        self.unsaid = 0                    # ... since the last line
        self._said_at = 0.0

    def result(self, ok: bool, reason: str | None = None) -> None:
        now = self.clock()
        if ok:
            if self.reason is not None:
                self.say(f"export to {self.endpoint} works again after {self.failed} failed "
                         f"export{'s' if self.failed != 1 else ''} (their readings were dropped; totals carry on)")
            self.reason, self.failed, self.unsaid = None, 0, 0
            return
        self.failed += 1
        self.unsaid += 1
        if reason in (None, GAVE_UP):   # the exporter said nothing but "gave up" (no retry fitted its timeout)
            reason = self.reason or (self.explain() if self.explain else None) or GAVE_UP
        if reason != self.reason or now - self._said_at >= self.every_s:
            again = reason == self.reason
            self.say(f"export to {self.endpoint} failed: {reason}"
                     + (f" ({self.unsaid} failed exports since the last line; still retrying)" if again else
                        "; its readings are dropped, counters carry on at the next export that succeeds"))
            self.reason, self.unsaid, self._said_at = reason, 0, now
