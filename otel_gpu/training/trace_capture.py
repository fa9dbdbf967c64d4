"""Profiler captures of chosen steps in a rank: `otel-gpu run --trace-steps A-B` ($OTELGPU_TRACE_STEPS)
and requests from `otel-gpu trace capture` (the files: otel_gpu/trace/capture_files.py).

The session hands its Timer a `Capture` as step listener, told when a step opens and closes. Outside a
capture that costs a counter, a clock read, and (where a trace folder is watched, $OTELGPU_TRACE_DIR)
one stat of the request file at most once a second, at a step boundary. torch.profiler is not started
(nor imported by us) before step A opens: then it starts with CPU activity, CUDA too where
torch.cuda.is_available(), shapes and modules on, Python stacks only where $OTELGPU_TRACE_STACKS is 1, and each
captured step is marked `ProfilerStep#N`. When step B closes it stops (the device synchronised first, as torch
does) and its Chrome trace is exported to a temporary file, on the training thread; a background thread
then gzips it and renames it into place (trace_writer.py), so the trace is written whole or not at all,
and the process waits for it at exit (EXIT_WAIT_S at most, then drops it). Any failure is one log line,
the capture is abandoned with nothing left behind, and the training goes on.

The profiler is started, marked and stopped on one thread only: the one whose step boundary started it (the
training thread). A boundary seen on another thread while capturing counts the step but touches nothing of
the profiler (torch's profiler is not made to be stopped from another thread); the capture stops at the next
boundary of its own thread. With stacks on, torch's Python tracer hooks every Python thread of the process
for the captured steps (docs/capture.md: why they can be turned off).
"""
from __future__ import annotations

import atexit
import errno
import logging
import os
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError
from ..trace import capture_files as cf
from ..values import switch
from .trace_writer import Writer

log = logging.getLogger("otel_gpu.training")

RECENT_STEPS = 4096      # uncaptured step times kept (the unprofiled median's basis)
POLL_STEPS = 64          # the latest of them that a poll answer's step time is the median of
EXIT_WAIT_S = 30.0       # how long the process waits at exit for a trace being gzip'd before dropping it


def _median(values) -> float | None:
    return statistics.median(values) if values else None


def _profiler_enabled() -> bool:
    """A torch profiler (autograd or Kineto) is on in this process now."""
    import torch
    probe = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    return bool(probe()) if probe is not None else False


class Capture:
    """A rank's step listener: captures its window of steps, answers requests (see the module doc)."""

    def __init__(self, root: Path, rank: str, window: tuple[int, int] | None = None, watch: bool = False,
                 clock=time.monotonic, stacks: bool = cf.DEFAULT_STACKS):
        self.root, self.rank, self.watch, self.clock = Path(root), str(rank), watch, clock
        self.stacks = stacks                  # with_stack: torch's Python tracer on for the captured steps
        self.closed = 0                       # steps this rank has closed
        self.window = window                  # (start, end) to capture
        self.request: str | None = None       # the request the window came from (None: $OTELGPU_TRACE_STEPS)
        self.state = cf.ARMED if window else cf.IDLE
        self.message = ""
        self.file: str | None = None
        self.stop_s: float | None = None      # seconds the last capture's stop and export took on the training thread
        self.stop_parts_s: dict | None = None  # by part: stop, export (Chrome trace JSON); write (gzip, rename:
                                               # on the writer's thread)
        self._writer: Writer | None = None    # the trace being gzip'd (state WRITING)
        self._lock = threading.Lock()         # one status write at a time (the training and the writer's threads)
        self.answered: str | None = None      # the latest poll answered
        self.captured: list[float] = []       # host seconds of the captured steps
        self.recent: deque[float] = deque(maxlen=RECENT_STEPS)   # seconds of uncaptured steps
        self._skip = False                    # the step after a capture paid its stop and write
        self._next_check = 0.0
        self._seen = None                     # (inode, mtime ns, size) of the request file last read
        self._handled: set[str] = set()
        self._prof = None
        self._owner: int | None = None        # the thread that started the profiler: the only one to touch it
        self._orphan = None                   # a profiler abandoned on another thread: its owner stops it
        self._mark = None
        self._pid = os.getpid()
        self.status_path = self.root / cf.RANKS / f"rank{cf.safe_rank(rank)}-pid{self._pid}.json"

    # ---- the Timer's hooks (training thread); never raise ----
    def step_opened(self) -> None:
        try:
            if self._orphan is not None and self._on_owner():
                self._stop_orphan()
            n = self.closed + 1
            if self.state == cf.CAPTURING:
                if self._on_owner():
                    self._open_mark(n)
            elif self.state == cf.ARMED and n == self.window[0]:
                self._start(n)
            elif self.state == cf.ARMED and n > self.window[0]:
                self._missed(n - 1)
        except Exception as exc:  # never let our bug reach the training loop
            self._internal_error(exc)

    def step_closed(self, seconds: float) -> None:
        try:
            if self._orphan is not None and self._on_owner():
                self._stop_orphan()
            self.closed += 1
            if self.state == cf.CAPTURING:
                self.captured.append(seconds)
                if self._on_owner():
                    self._close_mark()
                    if self.closed >= self.window[1]:
                        self._finish()
                return
            if self._skip:
                self._skip = False
            else:
                self.recent.append(seconds)
            if self.watch:
                now = self.clock()
                if now >= self._next_check:
                    self._next_check = now + cf.CHECK_PERIOD_S
                    self._check()
        except Exception as exc:  # never let our bug reach the training loop
            self._internal_error(exc)

    # ---- requests ----
    def _check(self) -> None:
        path = self.root / cf.REQUEST
        try:
            st = os.stat(path)
        except OSError:
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._seen:
            return
        self._seen = key
        raw = cf.read_small(path, cf.REQUEST_MAX)
        req = cf.parse_request(raw) if raw is not None else None
        if req is None or req["id"] in self._handled:
            return
        self._handled.add(req["id"])
        if req["kind"] == "poll":
            self.answered = req["id"]
            self.write_status()
            return
        start, end = req["start"], req["end"]
        if self.state in (cf.ARMED, cf.CAPTURING, cf.WRITING):
            self._say(cf.FAILED, f"steps {start}-{end} not captured: busy with steps "
                                 f"{self.window[0]}-{self.window[1]}", request=req["id"], keep=True)
            return
        self.window, self.request, self.captured, self.file = (start, end), req["id"], [], None
        if start <= self.closed:
            self._missed(self.closed)
            return
        self.state, self.message = cf.ARMED, ""
        self.write_status()

    # ---- the capture ----
    def _start(self, n: int) -> None:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile
            if _profiler_enabled():   # torch would start ours over it, and stopping ours would end the job's
                self._abandon("a profiler is already running in this process (the job's own); left alone")
                return
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            prof = profile(activities=activities, record_shapes=True, with_stack=self.stacks, with_modules=True)
            prof.start()
        except Exception as exc:  # a profiler already running, an old torch: the job goes on
            self._abandon(f"the profiler did not start: {exc!r}")
            return
        self._prof, self.state, self.captured, self._owner = prof, cf.CAPTURING, [], threading.get_ident()
        self._open_mark(n)
        log.info("otel-gpu: rank %s: capturing steps %d-%d", self.rank, *self.window)

    def _on_owner(self) -> bool:
        """This thread started the running capture's profiler."""
        return threading.get_ident() == self._owner

    def _open_mark(self, n: int) -> None:
        from torch.autograd.profiler import record_function
        self._close_mark()   # a step opened again (another integration took the step boundaries over)
        mark = record_function(f"ProfilerStep#{n}")
        mark.__enter__()
        self._mark = mark

    def _close_mark(self) -> None:
        mark, self._mark = self._mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def _finish(self) -> None:
        t0 = self.clock()
        prof, self._prof = self._prof, None
        start, end = self.window
        folder = self.root / cf.capture_name(start, end)
        final = folder / cf.trace_file_name(self.rank)
        tmp_json = folder / f".{final.name}.{self._pid}.json.tmp"
        tmp_gz = folder / f".{final.name}.{self._pid}.gz.tmp"
        try:
            prof.stop()
            t1 = self.clock()
            folder.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(tmp_json))
            t2 = self.clock()
        except Exception as exc:  # a full disk, a profiler error: said once, nothing half-written
            try:
                tmp_json.unlink()
            except OSError:
                pass
            self._abandon(f"the trace was not written: {exc!r}")
            return
        self.stop_s = t2 - t0
        self.stop_parts_s = {"stop": t1 - t0, "export": t2 - t1, "write": None}
        self._skip = True
        self.state = cf.WRITING

        def written(seconds: float, error: BaseException | None) -> None:   # on the writer's thread
            self.stop_parts_s = {**self.stop_parts_s, "write": seconds}
            if error is not None:
                self._say(cf.FAILED, f"steps {start}-{end} abandoned: the trace was not written: {error!r}")
                return
            self.file = str(final)
            self._say(cf.WRITTEN, f"steps {start}-{end} written to {final}", level=logging.INFO)

        self._writer = Writer(tmp_json, tmp_gz, final, written)
        self._writer.start()

    def flush(self, wait_s: float = EXIT_WAIT_S) -> bool:
        """Wait up to `wait_s` s for a trace being written, then drop it; True when none is left pending."""
        writer = self._writer
        return writer is None or writer.finish(wait_s)

    def _missed(self, at: int) -> None:
        start, end = self.window
        self._say(cf.MISSED, f"steps {start}-{end} not captured: this rank was already at step {at}")

    def _internal_error(self, exc: Exception) -> None:
        try:
            self._abandon(f"internal error: {exc!r}")
        except Exception as again:  # even saying so failed: this rank stops capturing, the training goes on
            self.state, self.watch = cf.FAILED, False
            log.warning("otel-gpu: rank %s: trace capture off after an internal error: %r", self.rank, again)

    def _abandon(self, why: str) -> None:
        """Stop whatever the capture started; one line; the training goes on."""
        self._mark = None
        prof, self._prof = self._prof, None
        if prof is not None and not self._on_owner():   # its own thread stops it, at its next step boundary
            self._orphan = prof
        elif prof is not None:
            try:
                prof.stop()
            except Exception as exc:  # the profiler is broken: nothing more to do with it
                why += f"; stopping it failed too: {exc!r}"
        window = f"steps {self.window[0]}-{self.window[1]}" if self.window else "the capture"
        self._say(cf.FAILED, f"{window} abandoned: {why}")

    def _stop_orphan(self) -> None:
        prof, self._orphan = self._orphan, None
        try:
            prof.stop()
        except Exception as exc:  # the profiler is broken: nothing more to do with it
            log.warning("otel-gpu: rank %s: stopping an abandoned profiler failed: %r", self.rank, exc)

    def _say(self, state: str, message: str, request: str | None = None, keep: bool = False,
             level: int = logging.WARNING) -> None:
        """One log line and the status file; `keep`: about another request, this capture's state stays."""
        log.log(level, "otel-gpu: rank %s: trace %s", self.rank, message)
        if keep:
            self.write_status(state=state, message=message, request=request)
            return
        self.state, self.message = state, message
        self.write_status()

    # ---- status ----
    def status(self, **override) -> dict:
        from ..stacks import start_ticks
        recent = list(self.recent)
        doc = {"rank": self.rank, "pid": self._pid, "start_ticks": start_ticks() or 0, "time": time.time(),
               "step": self.closed, "state": self.state, "request": self.request, "answered": self.answered,
               "window": list(self.window) if self.window else None, "file": self.file, "message": self.message,
               "step_s": _median(recent[-POLL_STEPS:]), "captured_step_s": list(self.captured),
               "unprofiled_median_s": _median(recent), "unprofiled_steps": len(recent), "stop_s": self.stop_s,
               "stop_parts_s": self.stop_parts_s, "stacks": self.stacks}
        doc.update(override)
        return doc

    def write_status(self, **override) -> bool:
        import json
        try:
            with self._lock:   # the doc and its file together: the last file written has the latest state
                cf.write_whole(self.status_path, json.dumps(self.status(**override)))
            return True
        except OSError as exc:
            # a full disk is said once, by `run` for its recording: the rank's status adds nothing to that
            say = log.info if exc.errno in (errno.ENOSPC, errno.EDQUOT) else log.warning
            say("otel-gpu: rank %s: trace status not written (%s): %s", self.rank, self.status_path,
                exc.strerror or exc)
            return False

    def at_exit(self) -> None:
        """The process ends: a capture armed or running is said to be cut short; the status gets the final
        step count and unprofiled median."""
        if os.getpid() != self._pid:
            return
        try:
            if self.state == cf.WRITING and not self.flush(EXIT_WAIT_S) and self.state == cf.WRITING:
                self.state = cf.ENDED   # the writer is stuck (a hung file system): said, and left to the exit
                self.message = f"steps {self.window[0]}-{self.window[1]}: the job ended while its trace was being " \
                               f"written; no trace written"
            if self.state == cf.ARMED:
                self.state = cf.ENDED
                self.message = f"steps {self.window[0]}-{self.window[1]} not captured: the job ended at step " \
                               f"{self.closed}"
            elif self.state == cf.CAPTURING:
                self._mark = None
                prof, self._prof = self._prof, None
                try:
                    if self._on_owner():   # else the process ends with it: never stopped from another thread
                        prof.stop()
                finally:
                    self.state = cf.ENDED
                    self.message = f"steps {self.window[0]}-{self.window[1]} not captured: the job ended inside " \
                                   f"the capture, at step {self.closed}; no trace written"
            if self.state == cf.ENDED:
                log.warning("otel-gpu: rank %s: trace %s", self.rank, self.message)
            self.write_status()
        except Exception as exc:  # at exit: one line, never a traceback
            log.warning("otel-gpu: rank %s: trace status at exit: %r", self.rank, exc)


def _stacks(env: Mapping[str, str]) -> bool:
    """$OTELGPU_TRACE_STACKS as a switch (unset: the default); a bad value is said once and means off."""
    raw = env.get(cf.TRACE_STACKS, "").strip()
    if not raw:
        return cf.DEFAULT_STACKS
    try:
        return switch(raw, cf.TRACE_STACKS)
    except ConfigError as exc:
        log.warning("otel-gpu: %s; traces without Python stacks", exc)
        return False


def install(env: Mapping[str, str], rank: str, timer, at_exit=atexit.register) -> Capture | None:
    """A `Capture` as `timer`'s step listener when $OTELGPU_TRACE_STEPS or $OTELGPU_TRACE_DIR is set, its
    `at_exit` registered with `at_exit`; None (with the reason logged) when neither is set, or the trace
    folder cannot be written."""
    raw = env.get(cf.TRACE_STEPS, "").strip()
    watch = bool(env.get(cf.TRACE_DIR, "").strip())
    if not raw and not watch:
        return None
    window = None
    if raw:
        try:
            window = cf.parse_steps(raw)
        except ConfigError as exc:
            log.warning("otel-gpu: no trace capture: %s", exc)
            if not watch:
                return None
    root = cf.trace_root(env).resolve()
    try:
        (root / cf.RANKS).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("otel-gpu: no trace capture: cannot make %s: %s", root / cf.RANKS, exc.strerror or exc)
        return None
    capture = Capture(root, rank, window, watch, stacks=_stacks(env))
    if not capture.write_status():
        return None
    timer.step_listener = capture
    at_exit(capture.at_exit)
    return capture
