"""GPU-timed collective time of NCCL process groups, read from PyTorch's Flight Recorder.

With NCCL a collective returns to Python before the GPU has waited, so host timing (collectives.py)
measures nothing there. ProcessGroupNCCL times every collective on the GPU itself when timing is on
(CUDA events around the kernel on the NCCL stream; `TORCH_NCCL_ENABLE_TIMING=1`) and keeps it in its
Flight Recorder ring (`TORCH_NCCL_TRACE_BUFFER_SIZE` entries). That covers every collective of every
NCCL group, the ones DDP's C++ reducer, FSDP and DeepSpeed issue included.

`prepare_env` turns both on before the process group exists (the `torch` import hook and `otel-gpu
run` call it). A `Poller` thread dumps the ring every `interval_s` through the control-plane handler,
which runs without the GIL (the plain `_dump_nccl_trace_json` binding holds it and is the fallback),
decodes it (flight_recorder.py) and adds each newly retired collective's GPU seconds to the sink,
by kind and process group, and hands it the last sequence number each group has started and
completed on this rank (in a hang, the ranks behind the others' started number hold them up).
What cannot be measured is counted by reason instead of guessed: timing off, records overwritten between polls (the interval halves when that happens), timing
refused because `CUDA_DEVICE_MAX_CONNECTIONS=1` (timing events would serialise communication with
compute), no Flight Recorder in this torch.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, MutableMapping, Protocol

from . import flight_recorder as fr

log = logging.getLogger("otel_gpu.training")

BASIS = "gpu"   # the otelgpu.collective.basis of what this module exports
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")   # the ring's size (0: off before torch 2.11)
BUFFER_SIZE = "2000"
# reasons, beside flight_recorder.REASONS, why a process's NCCL collectives are not measured
MAX_CONNECTIONS = "max_connections_1"
NO_RECORDER = "no_flight_recorder"
DUMP_FAILED = "dump_failed"
NO_RECORDS = "no_records"   # steps go on, the ring stays empty: recorder off, or collectives replayed in CUDA graphs
EMPTY_POLLS = 5             # polls after the first step with an empty ring before NO_RECORDS is said
INTERVAL_S = 1.0       # between dumps; halved down to MIN_INTERVAL_S after a ring overflow
MIN_INTERVAL_S = 0.25
OFF = ("0", "false", "no", "off")


class GpuSink(Protocol):
    def collective_gpu(self, kind: str, group: str, seconds: float, count: int) -> None: ...

    def unmeasured(self, reason: str, count: int) -> None: ...

    # optional: `collective_seq(group, state, seq)`, the last sequence number started / completed per group


def prepare_env(env: MutableMapping[str, str]) -> str | None:
    """Turn NCCL timing and the Flight Recorder on in `env` where the user has not chosen; return the
    reason they stay off (None when on). Must run before the NCCL process group is created."""
    if env.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip() == "1":
        return MAX_CONNECTIONS
    if not env.get("TORCH_NCCL_ENABLE_TIMING", "").strip():   # unset or blank: ours; a user's value stays
        env["TORCH_NCCL_ENABLE_TIMING"] = "1"
    if not any(env.get(k, "").strip() for k in BUFFER_VARS):   # a user's own size (either name) stays
        env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = BUFFER_SIZE
    if env.get("TORCH_NCCL_ENABLE_TIMING", "").strip().lower() in OFF:
        return fr.UNTIMED
    if any(env.get(k, "").strip() == "0" for k in BUFFER_VARS):
        return NO_RECORDER
    return None


def handler_dump(c10d, name: str = "dump_nccl_trace_json") -> Callable[[], str | bytes] | None:
    """A control-plane JSON dump handler as a call (it runs without the GIL), or None without it
    (`fr_trace_json` is the generic recorder's: gloo's, on torch >= 2.10)."""
    names = getattr(c10d, "_get_handler_names", None)
    if names is None or name not in names():
        return None
    handler = c10d._get_handler(name)

    class Request(c10d._Request):
        def body(self):
            return b""

        def get_param(self, key):
            return ""

        def params(self):
            return {}

    class Response(c10d._Response):
        def __init__(self):
            super().__init__()
            self.content, self.status = None, 200

        def set_content(self, content, content_type):
            self.content = content

        def set_status(self, status):
            self.status = status

    def dump():
        resp = Response()
        handler(Request(), resp)
        if resp.status != 200 or resp.content is None:
            raise fr.FlightRecorderError(f"the Flight Recorder handler answered {resp.status}: {resp.content!r:.200}")
        return resp.content

    return dump


def find_dump(c10d) -> tuple[Callable[[], str | bytes] | None, str]:
    """(a call returning one dump of the NCCL Flight Recorder, how) for this torch; (None, why) without one.
    The handler's defaults are what we want: every collective, no stack traces. The handler is tried once:
    on some torch builds (2.11 on an H100/H200) calling it from Python fails (pybind11 cannot return our
    Request's parameters to C++), and the plain binding serves instead."""
    dump = handler_dump(c10d)
    if dump is not None:
        try:
            dump()
            return dump, "control-plane handler dump_nccl_trace_json (GIL released)"
        except Exception as exc:   # an unknown torch: the bindings below still dump
            log.debug("otel-gpu: the Flight Recorder handler cannot be called from Python here: %r", exc)
    if hasattr(c10d, "_dump_nccl_trace_json"):
        return (lambda: c10d._dump_nccl_trace_json(includeCollectives=True, onlyActive=False),
                "_dump_nccl_trace_json (holds the GIL while it dumps)")
    if hasattr(c10d, "_dump_nccl_trace"):
        return (lambda: c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False),
                "_dump_nccl_trace pickle (holds the GIL while it dumps)")
    return None, "this torch has no NCCL Flight Recorder"


class Poller:
    """Dumps the Flight Recorder every `interval_s` on its own daemon thread and hands the sink each
    retired collective's GPU seconds once (those created after `since_ns()`, the first step's start)."""

    def __init__(self, dump: Callable[[], str | bytes], sink: GpuSink, since_ns: Callable[[], int | None],
                 interval_s: float = INTERVAL_S, min_interval_s: float = MIN_INTERVAL_S):
        self.dump, self.sink, self.since_ns = dump, sink, since_ns
        self.interval_s, self.min_interval_s = interval_s, min_interval_s
        self.cursor = fr.Cursor()
        self.error: str | None = None
        self._empty = 0             # polls since the first step that found the ring empty
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = getattr(sink, "collective_seq", None)   # (group, state, seq): who is behind in a hang

    def poll_once(self) -> fr.Poll:
        """One dump -> the sink. Before the first step, records are consumed and not reported."""
        since = self.since_ns()
        _, recs = fr.parse(self.dump(), min_id=self.cursor.next_id)
        if self._seq is not None:   # from the first poll: a hang before the first step shows too
            for (group, state), seq in fr.last_seqs(recs).items():
                self._seq(group, state, seq)
        got = self.cursor.update(recs, since_ns=since if since is not None else 1 << 62)
        if since is not None:
            totals: dict[tuple[str, str], list] = {}
            for r in got.timed:
                acc = totals.setdefault((r.kind, r.group), [0.0, 0])
                acc[0] += r.duration_s
                acc[1] += 1
            for (kind, group), (seconds, count) in totals.items():
                self.sink.collective_gpu(kind, group, seconds, count)
            for reason, n in got.unmeasured.items():
                self.sink.unmeasured(reason, n)
        if since is not None and self.cursor.next_id is None:
            self._empty += 1
            if self._empty == EMPTY_POLLS:
                self.sink.unmeasured(NO_RECORDS, 1)
        if fr.OVERFLOW in got.unmeasured and self.interval_s > self.min_interval_s:
            self.interval_s = max(self.min_interval_s, self.interval_s / 2)
            log.info("otel-gpu: the Flight Recorder ring overflowed between polls: polling every %.2f s", self.interval_s)
        return got

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll_once()
            except Exception as exc:   # never reaches the training thread; said once, then stop polling
                self.error = f"{type(exc).__name__}: {exc}"
                self.sink.unmeasured(DUMP_FAILED, 1)
                log.warning("otel-gpu: GPU collective time not measured from here on: %s", self.error)
                return

    def start(self) -> "Poller":
        self._thread = threading.Thread(target=self._run, name="otelgpu-nccl-timing", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_poll: bool = True, timeout_s: float = 2.0) -> None:
        """Stop the thread; one last poll counts what retired since the previous one. Returns within
        about `timeout_s` whatever the dump does: the last poll runs on a daemon thread, and none is
        made while the thread's own dump has not returned (another would hang the same way)."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.debug("otel-gpu: the Flight Recorder dump has not returned; no last poll")
                return
        if final_poll and self.error is None:
            last = threading.Thread(target=self._last_poll, name="otelgpu-nccl-timing-last", daemon=True)
            last.start()
            last.join(max(0.0, deadline - time.monotonic()))

    def _last_poll(self) -> None:
        try:
            self.poll_once()
        except Exception as exc:   # at exit: what was counted so far stays
            log.debug("otel-gpu: last Flight Recorder poll failed: %r", exc)


_lock = threading.Lock()
_poller: list[Poller] = []


def start(sink: GpuSink, since_ns: Callable[[], int | None], env: MutableMapping[str, str] | None = None) -> Poller | None:
    """Start the process's poller once (the default group is NCCL); None, with the reason counted in the
    sink, when the collectives cannot be timed here."""
    with _lock:
        if _poller:
            return _poller[0]
        env = os.environ if env is None else env
        reason = prepare_env(dict(env))   # what the process group was created with (no change now)
        if reason is None and env.get("TORCH_NCCL_ENABLE_TIMING", "").strip() != "1":
            reason = _enable_timing_now()
        if reason is None:
            from torch._C import _distributed_c10d as c10d
            dump, how = find_dump(c10d)
            if dump is None:
                reason = NO_RECORDER
            else:
                log.debug("otel-gpu: NCCL collective time from the Flight Recorder via %s", how)
                return _launch(dump, sink, since_ns)
        sink.unmeasured(reason, 1)
        log.warning("otel-gpu: NCCL collective time not measured (%s): see docs/diagnose.md", reason)
        return None


def launch(dump: Callable[[], str | bytes], sink: GpuSink, since_ns: Callable[[], int | None],
           interval_s: float = INTERVAL_S) -> Poller:
    """Start the process's poller on a given dump call (another recorder, or a synthetic one in tests);
    stopped with a last poll by `stop()` at the session's exit."""
    with _lock:
        return _launch(dump, sink, since_ns, interval_s)


def _launch(dump, sink, since_ns, interval_s: float = INTERVAL_S) -> Poller:
    if not _poller:
        _poller.append(Poller(dump, sink, since_ns, interval_s=interval_s).start())
    return _poller[0]


def _enable_timing_now() -> str | None:
    """Timing for the default group when the environment did not turn it on before it was created
    (a loop instrumented by hand after `init_process_group`); other groups stay untimed."""
    import torch.distributed as dist

    enable = getattr(dist.group.WORLD, "_enable_collectives_timing", None)
    if enable is None:
        return fr.UNTIMED
    enable()
    return None


def stop() -> None:
    """Stop the poller after a last poll (the session's exit, before the final export)."""
    with _lock:
        while _poller:
            _poller.pop().stop()
