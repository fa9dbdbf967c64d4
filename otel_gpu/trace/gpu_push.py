"""GPU time by launching code (:mod:`.gpu_flame`) as pprof profiles, pushed to Pyroscope.

One profile series per rank, as the pyroscope-io agent pushes CPU profiles (``POST
/push.v1.PusherService/Push``, a gzip'd ``push.v1.PushRequest``): labels ``__name__=gpu_time`` (its own
profile type in Pyroscope: ``gpu_time:gpu_time:nanoseconds:gpu_time:nanoseconds``), ``service_name``,
``rank`` and, when given, ``job``; one sample per stack, its value the GPU time in nanoseconds.
A profile is stamped with the push's time (the trace's own clock is not wall time on every profiler
version) unless its rank's window is given: then its pprof ``time_nanos``/``duration_nanos`` (the
profile's from/until in Pyroscope) are that window. The push is one request within one deadline
(:mod:`..http_deadline`): a server that is down or slow costs at most ``timeout_s``.
Grafana's flame graph panel shows it per rank with a Pyroscope query on that profile type.
"""
from __future__ import annotations

import gzip
import time
import uuid
from typing import Mapping

from ..record import protos
from .gpu_flame import SAMPLE_TYPE, UNIT

PUSH_PATH = "/push.v1.PusherService/Push"
MAX_REPLY_BYTES = 64 * 1024   # what is read of the server's answer (it is only shown on an error)


class PushError(Exception):
    """The push failed; the message is one line naming the server and why."""


def pprof_profile(stacks: dict[tuple[str, ...], int], time_ns: int, duration_ns: int = 0) -> bytes:
    """A pprof ``Profile`` (serialized, not compressed): sample type ``gpu_time``/``nanoseconds``, one
    sample per stack (frames root first in ``stacks``; pprof lists them leaf first)."""
    p = protos.Profile()
    strings: dict[str, int] = {}

    def s(text: str) -> int:
        i = strings.get(text)
        if i is None:
            i = strings[text] = len(strings)
            p.string_table.append(text)
        return i
    s("")   # pprof: the string table starts with ""
    p.sample_type.add(type=s(SAMPLE_TYPE), unit=s(UNIT))
    p.period_type.type, p.period_type.unit, p.period = s(SAMPLE_TYPE), s(UNIT), 1
    p.time_nanos, p.duration_nanos = int(time_ns), int(duration_ns)
    loc: dict[str, int] = {}
    for stack, ns in sorted(stacks.items(), key=lambda kv: (-kv[1], kv[0])):
        if ns <= 0:
            continue
        ids = []
        for f in reversed(stack):
            i = loc.get(f)
            if i is None:
                i = loc[f] = len(loc) + 1
                p.function.add(id=i, name=s(f), system_name=s(f))
                p.location.add(id=i).line.add(function_id=i)
            ids.append(i)
        p.sample.add(location_id=ids, value=[int(ns)])
    return p.SerializeToString()


def push_body(per_rank: dict[int, dict[tuple[str, ...], int]], service_name: str, job: str | None = None,
              time_ns: int | None = None, windows: Mapping[int, tuple[int, int]] | None = None) -> bytes:
    """The gzip'd ``PushRequest`` for every rank's stacks (ranks without GPU time are left out); a rank in
    ``windows`` gets its (start, duration) in ns since the epoch as its profile's time, the others
    ``time_ns`` (default: now) and no duration."""
    t = time.time_ns() if time_ns is None else time_ns
    windows = windows or {}
    req = protos.PushRequest()
    for rank, stacks in sorted(per_rank.items()):
        if not any(ns > 0 for ns in stacks.values()):
            continue
        series = req.series.add()
        labels = {"__name__": SAMPLE_TYPE, "service_name": service_name, "rank": str(rank)}
        if job:
            labels["job"] = job
        for k, v in labels.items():
            series.labels.add(name=k, value=v)
        series.samples.add(raw_profile=pprof_profile(stacks, *windows.get(rank, (t, 0))), ID=str(uuid.uuid4()))
    return gzip.compress(req.SerializeToString(), mtime=0)


def push(url: str, body: bytes, timeout_s: float = 10.0) -> None:
    """POST ``body`` to the Pyroscope server at ``url`` (its base, e.g. http://127.0.0.1:4040), the whole
    request within ``timeout_s`` seconds; PushError unless it answers 2xx."""
    import httpx

    from ..http_deadline import deadline_client, request
    from ..inflate import TooLarge
    from ..record.receiver import forward_error
    from ..safe_text import visible

    target = url.rstrip("/") + PUSH_PATH
    try:
        with deadline_client(timeout_s) as client:
            r = request(client, "POST", target, timeout=timeout_s, max_bytes=MAX_REPLY_BYTES, content=body,
                        headers={"Content-Type": "application/proto", "Content-Encoding": "gzip"})
    except httpx.TimeoutException:
        raise PushError(f"{target}: no answer within {timeout_s:g} s") from None
    except (httpx.HTTPError, OSError, TooLarge) as exc:   # refused, unknown name, a reply too large or malformed
        raise PushError(f"{target}: {visible(forward_error(exc))}") from None
    if not 200 <= r.status_code < 300:
        reply = r.content.decode("utf-8", "replace")
        raise PushError(f"{target}: HTTP {r.status_code} {visible(' '.join(reply.split())[:200])}".rstrip())
