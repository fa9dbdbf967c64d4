"""Prometheus HTTP API client (works against Prometheus and VictoriaMetrics alike).

Every failure (server down, too slow, query rejected, malformed answer) is a ``PromError`` with
one line naming the server URL and the cause. The client counts its requests and their wall time
in ``stats`` so benchmarks can report how many queries a feature costs and how long they took.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

import httpx

from .http_deadline import deadline_client, install, request
from .inflate import TooLarge, mib

TimeLike = float | int | datetime
MAX_ANSWER_BYTES = 64 << 20   # an API answer, decompressed: more is refused in one line


class PromError(RuntimeError):
    """A Prometheus API call failed; ``str()`` is one line with the URL and the cause."""


@dataclass(frozen=True)
class Series:
    """One series of a result: its labels and its (unix seconds, value) points, oldest first."""

    labels: dict[str, str]
    points: list[tuple[float, float]]

    @property
    def name(self) -> str | None:
        return self.labels.get("__name__")

    @property
    def value(self) -> float:
        """The last point's value (the only one for an instant query); NaN when there is none."""
        return self.points[-1][1] if self.points else math.nan


@dataclass
class QueryStats:
    """What the client has asked so far: request counts and wall time in seconds."""

    queries: int = 0  # /query and /query_range calls
    requests: int = 0  # every API call, metadata included
    errors: int = 0
    seconds: float = 0.0  # total wall time of all requests
    query_seconds: float = 0.0  # wall time of /query and /query_range calls
    by_endpoint: dict[str, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()

    def as_dict(self) -> dict[str, Any]:
        return {
            "queries": self.queries,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 6),
            "query_seconds": round(self.query_seconds, 6),
            "by_endpoint": dict(self.by_endpoint),
        }


# -- pure helpers -------------------------------------------------------------------------------


def format_time(t: TimeLike) -> str:
    """Unix seconds (or an aware/naive datetime, taken as local) as the API's decimal string."""
    if isinstance(t, datetime):
        t = t.timestamp()
    return f"{float(t):.3f}"


def format_step(step: float | int | str) -> str:
    """A step in seconds (number) or a Prometheus duration string such as ``"15s"``."""
    if isinstance(step, str):
        return step
    if step <= 0:
        raise ValueError(f"step must be positive, got {step}")
    return f"{float(step):g}"


def _sample(pair: list) -> tuple[float, float]:
    t, v = pair
    return float(t), float(v)


def parse_result(data: dict) -> list[Series]:
    """The ``data`` member of a /query or /query_range answer as a list of Series
    (ValueError, KeyError or TypeError when it is not one)."""
    if not isinstance(data, dict):
        raise ValueError(f"the data member is {type(data).__name__}, not an object")
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "vector":
        return [Series(dict(r["metric"]), [_sample(r["value"])]) for r in result]
    if kind == "matrix":
        return [Series(dict(r["metric"]), [_sample(p) for p in r["values"]]) for r in result]
    if kind == "scalar":
        return [Series({}, [_sample(result)])]
    raise ValueError(f"unsupported result type {kind!r}")


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _os_cause(exc: BaseException) -> str:
    """The most specific reason in an exception chain, e.g. "connection refused"."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror.lower()
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if text.startswith("[Errno") and "]" in text:
        text = text.split("]", 1)[1]
    return _one_line(text).lower() or type(exc).__name__


# -- the client -------------------------------------------------------------------------------


class PromClient:
    """Client for ``/api/v1`` of a Prometheus-compatible server at ``base_url``.

    ``timeout`` is seconds per request, the whole of it: connect, send and every read of the answer
    (``http_deadline``); ``max_bytes`` bounds an answer's size (decompressed as it is read). Pass ``client`` to share an ``httpx.Client``; otherwise the client owns one
    (``close()``).
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 10.0,
        client: httpx.Client | None = None,
        *,
        name: str = "Prometheus",
        max_bytes: int = MAX_ANSWER_BYTES,
        params: dict[str, str] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.name = name
        self.max_bytes = max_bytes
        # sent with every query: e.g. VictoriaMetrics' latency_offset=0s (it otherwise hides the newest
        # 30 s); Prometheus ignores parameters it does not know
        self.params = dict(params or {})
        self._owns_client = client is None
        if client is None:
            client = deadline_client(timeout)
        else:
            install(client)
        self._client = client
        self.stats = QueryStats()
        self.last_warnings: list[str] = []

    # -- queries
    def query(self, expr: str, time: TimeLike | None = None) -> list[Series]:
        """Instant query at ``time`` (unix seconds; default: this machine's now, sent explicitly:
        left to itself VictoriaMetrics answers for its now rounded down to the second, and misses
        what was written in the last second, such as the final export of a run that just ended)."""
        params = {**self.params, "query": expr, "time": format_time(_time.time() if time is None else time)}
        return self._parse(self._call("/api/v1/query", params, query=True), expr)

    def query_range(
        self, expr: str, start: TimeLike, end: TimeLike, step: float | int | str
    ) -> list[Series]:
        """Range query from ``start`` to ``end`` (unix seconds) every ``step`` seconds."""
        params = {
            **self.params,
            "query": expr,
            "start": format_time(start),
            "end": format_time(end),
            "step": format_step(step),
        }
        return self._parse(self._call("/api/v1/query_range", params, query=True), expr)

    def series(
        self, match: str | Iterable[str], start: TimeLike | None = None, end: TimeLike | None = None
    ) -> list[dict[str, str]]:
        """Label sets of the series matching one or more selectors."""
        matches = [match] if isinstance(match, str) else list(match)
        params: dict[str, Any] = {"match[]": matches}
        if start is not None:
            params["start"] = format_time(start)
        if end is not None:
            params["end"] = format_time(end)
        data = self._call("/api/v1/series", params) or []
        if not (isinstance(data, list) and all(isinstance(s, dict) and all(isinstance(v, str) for v in s.values())
                                               for s in data)):
            raise PromError(f"{self.name} at {self.base_url} gave a malformed answer to /api/v1/series")
        return [dict(s) for s in data]

    def label_values(self, label: str, match: str | Iterable[str] | None = None) -> list[str]:
        """Values of ``label``, optionally only on series matching ``match``."""
        params: dict[str, Any] = {}
        if match is not None:
            params["match[]"] = [match] if isinstance(match, str) else list(match)
        data = self._call(f"/api/v1/label/{label}/values", params, method="GET") or []
        if not (isinstance(data, list) and all(isinstance(v, str) for v in data)):
            raise PromError(f"{self.name} at {self.base_url} gave a malformed answer to /api/v1/label/{label}/values")
        return data

    def ready(self) -> bool:
        """True when the server answers 200 on ``/-/ready`` (VictoriaMetrics: also ``/health``)."""
        for path in ("/-/ready", "/health"):
            try:
                r = request(self._client, "GET", self.base_url + path, timeout=self.timeout)
            except httpx.HTTPError:
                return False
            if r.status_code == 200:
                return True
            if r.status_code != 404:
                return False
        return False

    # -- lifecycle
    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> "PromClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals
    def _parse(self, data: Any, expr: str) -> list[Series]:
        try:
            return parse_result(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise PromError(
                f"{self.name} at {self.base_url} gave a malformed answer to {_one_line(expr, 80)!r}: {exc}"
            ) from None

    def _call(self, path: str, params: dict, *, query: bool = False, method: str = "POST") -> Any:
        """One API call; returns the ``data`` member or raises PromError."""
        url = self.base_url + path
        endpoint = path.rsplit("/", 1)[-1] if query else path.split("/")[3]
        started = _time.perf_counter()
        ok = False
        try:
            try:
                if method == "POST":
                    r = request(self._client, "POST", url, data=params, timeout=self.timeout, max_bytes=self.max_bytes)
                else:
                    r = request(self._client, "GET", url, params=params, timeout=self.timeout, max_bytes=self.max_bytes)
            except TooLarge:
                raise PromError(
                    f"{self.name} at {self.base_url} answered {path} with more than {mib(self.max_bytes)}: "
                    "not read (a shorter window or a narrower query keeps it under)"
                ) from None
            except httpx.TimeoutException:
                raise PromError(
                    f"{self.name} at {self.base_url} did not answer within {self.timeout:g} s ({path})"
                ) from None
            except httpx.HTTPError as exc:
                raise PromError(
                    f"{self.name} at {self.base_url} is unreachable: {_os_cause(exc)}"
                ) from None
            body = self._json(r, path)
            if r.status_code != 200 or body.get("status") != "success":
                kind = body.get("errorType") or f"HTTP {r.status_code}"
                msg = body.get("error") or "no error message"
                raise PromError(f"{self.name} at {self.base_url} rejected {path}: {_one_line(str(kind))}: "
                                f"{_one_line(str(msg))}")
            self.last_warnings = list(body.get("warnings") or [])
            ok = True
            return body.get("data")
        finally:
            elapsed = _time.perf_counter() - started
            st = self.stats
            st.requests += 1
            st.seconds += elapsed
            st.by_endpoint[endpoint] = st.by_endpoint.get(endpoint, 0) + 1
            if query:
                st.queries += 1
                st.query_seconds += elapsed
            if not ok:
                st.errors += 1

    def _json(self, r: httpx.Response, path: str) -> dict:
        try:
            body = r.json()
        except ValueError:
            raise PromError(
                f"{self.name} at {self.base_url} answered {path} with HTTP {r.status_code}, "
                f"not JSON: {_one_line(r.text, 120) or '(empty body)'}"
            ) from None
        if not isinstance(body, dict):
            raise PromError(f"{self.name} at {self.base_url} answered {path} with unexpected JSON")
        return body
