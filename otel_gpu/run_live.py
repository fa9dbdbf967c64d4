"""`otel-gpu run`'s findings while the job runs, on stderr, from the recording being written.

A child process (`otel-gpu diagnose --watch RUN_DIR --json -`, at a lower CPU priority: it never
competes with the job or with the receiver that writes the recording) evaluates the rules every
`every_s` seconds over the last `last_s`; this side reads its events, prints one line each (at most
`MAX_PER_MINUTE` a minute; the rest are counted and said once), keeps every event in
`live-events.jsonl` in the run folder and, when a stall appears, asks the ranks for their Python
stacks (`on_stall`). The child's status lines go to `watch.log` there.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, TextIO

from . import children

MAX_PER_MINUTE = 6
MAX_LINE = 1 << 20      # bytes of one event line read from the child (a longer one is dropped)
LOG = "watch.log"
EVENTS = "live-events.jsonl"
NICE = 10


class LiveFindings:
    def __init__(self, run_dir: Path, env: dict[str, str], every_s: float = 10.0, last_s: float = 120.0,
                 thresholds: str | None = None, out: TextIO | None = None,
                 on_stall: Callable[[dict], None] | None = None):
        self.run_dir, self.env, self.every_s, self.last_s = run_dir, env, every_s, last_s
        self.thresholds = thresholds
        self.out = out or sys.stderr
        self.on_stall = on_stall
        self.proc: subprocess.Popen | None = None
        self.events: list[dict] = []     # every event read, shown or not
        self.hidden = 0
        self._shown: deque[float] = deque()
        self._thread: threading.Thread | None = None

    def start(self) -> "LiveFindings":
        code = (f"import os, sys; os.nice({NICE}); from otel_gpu.cli import main; sys.exit(main())")
        cmd = [sys.executable, "-c", code, "diagnose", "--watch", str(self.run_dir), "--json", "-",
               "--min-severity", "warning", "--every", f"{self.every_s:g}s", "--last", f"{self.last_s:g}s"]
        if self.thresholds:
            cmd += ["--thresholds", self.thresholds]
        try:
            with open(self.run_dir / LOG, "ab") as log:
                self.proc = children.popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=log)
        except OSError as exc:
            print(f"otel-gpu run: no findings while the job runs: {exc.strerror or exc}", file=self.out, flush=True)
            return self
        self._thread = threading.Thread(target=self._read, name="otel-gpu-live", daemon=True)
        self._thread.start()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.run_dir / EVENTS, "ab") as kept:
            for raw in iter(lambda: self.proc.stdout.readline(MAX_LINE), b""):
                try:
                    e = json.loads(raw)
                except ValueError:   # a cut line: not an event
                    continue
                if not isinstance(e, dict) or "event" not in e:
                    continue
                kept.write(raw if raw.endswith(b"\n") else raw + b"\n")
                kept.flush()
                self.events.append(e)
                self._react(e)

    def _react(self, e: dict) -> None:
        self._show(e)
        if e["event"] == "appeared" and e.get("rule") == "stall" and self.on_stall is not None:
            self.on_stall(e)

    def _show(self, e: dict) -> None:
        from .diagnose.watch import event_line
        now = time.monotonic()
        while self._shown and now - self._shown[0] > 60:
            self._shown.popleft()
        if len(self._shown) >= MAX_PER_MINUTE and e.get("rule") != "stall":
            self.hidden += 1
            return
        self._shown.append(now)
        print(f"otel-gpu run: {event_line(e)}", file=self.out, flush=True)

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the child (it stops at SIGTERM between evaluations) and say what was not shown."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.hidden:
            print(f"otel-gpu run: {self.hidden} more live finding event(s) not shown (at most {MAX_PER_MINUTE} a "
                  f"minute): `otel-gpu diagnose {self.run_dir}`", file=self.out, flush=True)
