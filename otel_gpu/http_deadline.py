"""One deadline per HTTP request: connect, send and every read of the answer within ``timeout`` seconds.

httpx's timeouts bound each socket operation, so a server that drips its answer one byte a second
never trips them. Here every socket operation of a request gets the time left until the request's
deadline (a monotonic clock), and the body is read in chunks with the deadline checked between
them. Past the deadline the request fails with ``httpx.TimeoutException``, as a per-read timeout
would, so callers keep one ``except httpx.TimeoutException`` for both.

Use ``deadline_client()`` for the client and ``request()`` for every call through it.
"""

from __future__ import annotations

import contextvars
import time
import zlib
from typing import Any

import httpcore
import httpx

from .inflate import DEFLATE, GZIP, Inflater, TooLarge

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("otelgpu_http_deadline", default=None)


def time_left(timeout: float | None, exc: type[Exception]) -> float | None:
    """The socket timeout (seconds) for one operation: ``timeout`` capped by the time left until the
    current request's deadline; raises ``exc`` when that has passed (pure but for the clock)."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise exc("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A network stream whose every read and write ends by the request deadline."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None):
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, time_left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """Wraps httpcore's network backend so every stream it opens honours the request deadline."""

    def __init__(self, inner: httpcore.NetworkBackend):
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        t = time_left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, t, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        t = time_left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, t, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def install(client: httpx.Client) -> int:
    """Make every transport of ``client`` (its own and the proxies' from the environment) honour the
    deadline; returns how many transports now do. httpx has no public hook for the network backend,
    so this reaches its connection pools; ``tests/test_promql_deadline.py`` fails if that changes."""
    done = 0
    for transport in [client._transport, *client._mounts.values()]:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is None:
            continue
        if not isinstance(backend, _Backend):
            pool._network_backend = _Backend(backend)
        done += 1
    return done


def deadline_client(timeout: float, **kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` (per-operation timeout ``timeout`` seconds) ready for ``request()``."""
    client = httpx.Client(timeout=timeout, **kwargs)
    install(client)
    return client


def request(client: httpx.Client, method: str, url: str, *, timeout: float, max_bytes: int | None = None,
            **kwargs: Any) -> httpx.Response:
    """Send one request and read its whole answer within ``timeout`` seconds (wall clock, monotonic),
    and with ``max_bytes``, at most that many bytes of it once decompressed (gzip and deflate are
    inflated here as they arrive, within the bound).

    Returns a read ``httpx.Response`` (``.status_code``, ``.json()``, ``.text``); raises
    ``httpx.TimeoutException`` past the deadline, ``inflate.TooLarge`` past ``max_bytes`` and other
    ``httpx.HTTPError`` as httpx does. ``client`` should come from ``deadline_client()`` (or
    ``install()``): without that only the body reads are bounded, between chunks."""
    deadline = time.monotonic() + timeout
    token = _DEADLINE.set(deadline)
    try:
        if max_bytes is not None:   # encodings we inflate within the bound, and no other
            kwargs["headers"] = {**dict(kwargs.get("headers") or {}), "accept-encoding": "gzip, deflate"}
        req = client.build_request(method, url, timeout=timeout, **kwargs)
        r = client.send(req, stream=True)
        try:
            chunks = []
            for chunk in (r.iter_bytes() if max_bytes is None else _bounded(r, max_bytes)):
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"the answer took longer than {timeout:g} s", request=req)
        finally:
            r.close()
    finally:
        _DEADLINE.reset(token)
    headers = [(k, v) for k, v in r.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(r.status_code, headers=headers, content=b"".join(chunks), request=req,
                          extensions={"http_version": r.extensions.get("http_version", b"HTTP/1.1")})


def _bounded(r: httpx.Response, max_bytes: int):
    """The answer's body, decompressed, in chunks; TooLarge once it passes `max_bytes`."""
    enc = r.headers.get("content-encoding", "").strip().lower()
    if enc not in ("", "identity", GZIP, DEFLATE):
        raise httpx.DecodingError(f"unsupported content-encoding {enc!r}", request=r.request)
    inflater = Inflater(enc, max_bytes, "the answer") if enc in (GZIP, DEFLATE) else None
    total = 0
    try:
        for raw in r.iter_raw():
            chunk = inflater.feed(raw) if inflater is not None else raw
            total += len(chunk)
            if total > max_bytes:
                raise TooLarge("the answer", max_bytes)
            yield chunk
        if inflater is not None:
            inflater.finish()
    except (zlib.error, EOFError) as exc:
        raise httpx.DecodingError(f"bad {enc} answer: {exc}", request=r.request) from None
