"""A capture's trace file written off the training thread.

The training thread stops the profiler and exports its Chrome trace to a temporary file (`src`); a
`Writer` then gzips that file into a second temporary file (`tmp`) on a background thread and renames
it to its final name (`final`), so the final name only ever holds a whole trace. Both temporary files
are removed whatever happens. `finish(wait_s)` (at process exit) waits for the write, and past
`wait_s` cancels it: the copy stops at its next 1 MiB chunk and leaves nothing behind. `done(seconds,
error)` is called once, on the writer's thread (or the caller's, where no thread could be started),
with the seconds the write took and the error that stopped it (None: written).
"""
from __future__ import annotations

import gzip
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

log = logging.getLogger("otel_gpu.training")

CHUNK = 1 << 20          # bytes copied between two looks at a cancel
CANCEL_WAIT_S = 2.0      # how long `finish` waits for a cancelled write to clean up


class Cancelled(Exception):
    """The process is ending: the write was dropped before its rename."""


class Writer:
    def __init__(self, src: Path, tmp: Path, final: Path, done: Callable[[float, BaseException | None], None],
                 level: int = 3):
        self.src, self.tmp, self.final, self.done, self.level = Path(src), Path(tmp), Path(final), done, level
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Write on a daemon thread; where no thread can be started, write here and now."""
        thread = threading.Thread(target=self._run, name="otelgpu-trace-write", daemon=True)
        try:
            thread.start()
        except RuntimeError:   # no more threads: the training thread pays the write, as before
            self._run()
            return
        self._thread = thread

    def finish(self, wait_s: float) -> bool:
        """Wait up to `wait_s` s for the write, then cancel it (and wait CANCEL_WAIT_S s for its clean-up).
        True when the writer is done (written, failed or dropped)."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(wait_s)
        if thread.is_alive():
            self._cancel.set()
            thread.join(CANCEL_WAIT_S)
        return not thread.is_alive()

    def _run(self) -> None:
        t0, error = time.monotonic(), None
        try:
            with open(self.src, "rb") as src, gzip.open(self.tmp, "wb", compresslevel=self.level) as dst:
                while chunk := src.read(CHUNK):
                    if self._cancel.is_set():
                        raise Cancelled("the process ended before the trace was written")
                    dst.write(chunk)
            os.replace(self.tmp, self.final)
        except (OSError, Cancelled, EOFError, ValueError) as exc:   # a full disk, a cancel: nothing half-written
            error = exc
        finally:
            for path in (self.src, self.tmp):
                try:
                    path.unlink()
                except OSError:   # already renamed, or never made
                    pass
        try:
            self.done(time.monotonic() - t0, error)
        except Exception as exc:  # on a background thread: one line, never a traceback into the job's log
            log.warning("otel-gpu: trace write: %r", exc)
