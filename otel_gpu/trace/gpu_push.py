"""GPU time by launching code (:mod:`.gpu_flame`) as pprof profiles, pushed to Pyroscope.

One profile series per rank, as the pyroscope-io agent pushes CPU profiles (``POST
/push.v1.PusherService/Push``, a gzip'd ``push.v1.PushRequest``): labels ``__name__=gpu_time`` (its own
profile type in Pyroscope: ``gpu_time:gpu_time:nanoseconds:gpu_time:nanoseconds``), ``service_name``,
``rank`` and, when given, ``job``; one sample per stack, its value the GPU time in nanoseconds,
stamped with the push's time (the trace's own clock is not wall time on every profiler version).
Grafana's flame graph panel shows it per rank with a Pyroscope query on that profile type.
"""
from __future__ import annotations

import gzip
import time
import urllib.error
import urllib.request
import uuid

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
              time_ns: int | None = None) -> bytes:
    """The gzip'd ``PushRequest`` for every rank's stacks (ranks without GPU time are left out)."""
    t = time.time_ns() if time_ns is None else time_ns
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
        series.samples.add(raw_profile=pprof_profile(stacks, t), ID=str(uuid.uuid4()))
    return gzip.compress(req.SerializeToString(), mtime=0)


def push(url: str, body: bytes, timeout_s: float = 10.0) -> None:
    """POST ``body`` to the Pyroscope server at ``url`` (its base, e.g. http://127.0.0.1:4040);
    PushError unless it answers 2xx."""
    target = url.rstrip("/") + PUSH_PATH
    req = urllib.request.Request(target, data=body, method="POST",
                                 headers={"Content-Type": "application/proto", "Content-Encoding": "gzip"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read(MAX_REPLY_BYTES)
    except urllib.error.HTTPError as exc:
        reply = exc.read(MAX_REPLY_BYTES).decode("utf-8", "replace")
        raise PushError(f"{target}: HTTP {exc.code} {' '.join(reply.split())[:200]}".rstrip()) from None
    except (urllib.error.URLError, OSError) as exc:
        raise PushError(f"{target}: {getattr(exc, 'reason', None) or exc}") from None
