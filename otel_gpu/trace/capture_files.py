"""Profiler captures of chosen steps: the files the ranks and `otel-gpu trace capture` talk through.

A trace folder (a recorded run's `traces/`, else $OTELGPU_TRACE_DIR) holds:

    request.json                  the latest request, written whole (a rename) by `otel-gpu trace capture`:
                                  {"id": ID, "kind": "poll"} asks every rank for its step now;
                                  {"id": ID, "kind": "capture", "start": S, "end": E} for a trace of steps S..E
    ranks/rank<R>-pid<P>.json     each rank's status, written whole by the rank (see `Status` fields below)
    steps-<S>-<E>/rank<R>.pt.trace.json.gz
                                  one capture: a Chrome-trace (Kineto) file per rank, steps S..E marked
                                  `ProfilerStep#N`; the folder `otel-gpu trace analyze` reads

Steps are counted by each rank from 1 (its first training step), so ranks of a synchronous job
name the same step with the same number. Everything read here was written by another process:
every read is bounded in size and every field checked. Nothing here imports torch.
"""
from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from pathlib import Path

from ..errors import ConfigError

TRACE_STEPS = "OTELGPU_TRACE_STEPS"   # A-B: every rank captures its steps A..B
TRACE_DIR = "OTELGPU_TRACE_DIR"       # where the traces go and requests are read (`run --record`: <run>/traces)
TRACE_STACKS = "OTELGPU_TRACE_STACKS"  # 0/1: Python stacks in captures (with_stack: torch's Python tracer)
DEFAULT_STACKS = False                # without $OTELGPU_TRACE_STACKS: off, torch's tracer can crash a rank (docs/capture.md)
DEFAULT_DIR = "otel-gpu-traces"       # the folder without $OTELGPU_TRACE_DIR (relative to the working directory)
RUN_SUBDIR = "traces"                 # a recorded run's trace folder
REQUEST = "request.json"
RANKS = "ranks"
MAX_STEP = 10**9                      # a step number beyond any run
MAX_SPAN = 500                        # steps in one capture at most (a trace grows with every step)
REQUEST_MAX = 4096                    # bytes read of a request
STATUS_MAX = 65536                    # bytes read of a rank's status
MAX_RANK_FILES = 16384                # status files looked at in one folder
CHECK_PERIOD_S = 1.0                  # a rank looks at the request file no more often than this (at a step boundary)
_STEPS = re.compile(r"(\d{1,10})(?:[ \t]*-[ \t]*(\d{1,10}))?", re.ASCII)
_ID = re.compile(r"[0-9a-f]{1,32}", re.ASCII)
CAPTURE_DIR = re.compile(r"steps-(\d{1,10})-(\d{1,10})", re.ASCII)

# a rank's states (Status "state")
IDLE, ARMED, CAPTURING, WRITING, WRITTEN, MISSED, FAILED, ENDED = \
    "idle", "armed", "capturing", "writing", "written", "missed", "failed", "ended"
FINAL = (WRITTEN, MISSED, FAILED, ENDED)   # what a capture ends as on a rank


def parse_steps(raw: str, what: str = TRACE_STEPS) -> tuple[int, int]:
    """`A-B` (or `A`: one step) -> (A, B): steps counted from 1, A <= B, at most MAX_SPAN steps (pure);
    ConfigError with one line otherwise."""
    m = _STEPS.fullmatch(str(raw).strip())
    if m is None:
        raise ConfigError(f"{what}={raw!r}: expected steps A-B (e.g. 5-6), counted from 1")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) is not None else a
    if not 1 <= a <= MAX_STEP or not 1 <= b <= MAX_STEP:
        raise ConfigError(f"{what}={raw!r}: steps are counted from 1 to {MAX_STEP}")
    if b < a:
        raise ConfigError(f"{what}={raw!r}: the last step comes before the first")
    if b - a + 1 > MAX_SPAN:
        raise ConfigError(f"{what}={raw!r}: at most {MAX_SPAN} steps in one capture, got {b - a + 1}")
    return a, b


def capture_name(start: int, end: int) -> str:
    """The folder of the capture of steps start..end."""
    return f"steps-{start}-{end}"


def trace_file_name(rank: str) -> str:
    """A rank's trace file in a capture folder (Chrome trace, gzip'd: `otel-gpu trace analyze` reads it)."""
    return f"rank{safe_rank(rank)}.pt.trace.json.gz"


def safe_rank(rank: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "_", str(rank))[:32] or "x"


def trace_root(env) -> Path:
    """Where a rank writes its traces: $OTELGPU_TRACE_DIR, else ./otel-gpu-traces."""
    raw = env.get(TRACE_DIR, "").strip()
    return Path(raw) if raw else Path(DEFAULT_DIR)


def parse_request(raw: bytes) -> dict | None:
    """A request's text -> {"id", "kind", "start", "end"} (pure); None for anything else."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) or not _ID.fullmatch(doc["id"]):
        return None
    if doc.get("kind") == "poll":
        return {"id": doc["id"], "kind": "poll", "start": None, "end": None}
    start, end = doc.get("start"), doc.get("end")
    if doc.get("kind") != "capture" or type(start) is not int or type(end) is not int:
        return None
    if not 1 <= start <= end <= MAX_STEP or end - start + 1 > MAX_SPAN:
        return None
    return {"id": doc["id"], "kind": "capture", "start": start, "end": end}


def request_text(request_id: str, kind: str, start: int | None = None, end: int | None = None) -> str:
    doc: dict = {"id": request_id, "kind": kind}
    if kind == "capture":
        doc.update(start=start, end=end)
    return json.dumps(doc)


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: a reader sees the old file or the new."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_small(path: Path, limit: int) -> bytes | None:
    """At most `limit` bytes of a regular file; None when it is not one, cannot be read or is longer."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):   # a pipe or a device is never read
                return None
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


_STATUS_FIELDS = {"rank": str, "pid": int, "start_ticks": int, "time": (int, float), "step": int, "state": str}


def parse_status(raw: bytes) -> dict | None:
    """A rank's status text -> dict (pure); None unless its fields have their types. Fields: rank, pid,
    start_ticks (the process start, /proc), time (unix s), step (steps closed so far), state, and
    optionally step_s (recent median step, s), request, answered (ids), window [S, E], file, message,
    captured_step_s, unprofiled_median_s, unprofiled_steps, stop_s."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    for key, kind in _STATUS_FIELDS.items():
        if not isinstance(doc.get(key), kind) or isinstance(doc.get(key), bool):
            return None
    return doc


def read_statuses(root: Path) -> list[dict]:
    """Every rank status in `root/ranks` that parses (bounded: MAX_RANK_FILES files of STATUS_MAX bytes),
    each with "path" added; sorted by rank number, then PID."""
    out = []
    try:
        names = sorted(os.listdir(root / RANKS))[:MAX_RANK_FILES]
    except OSError:
        return []
    for name in names:
        if not (name.startswith("rank") and name.endswith(".json")):
            continue
        raw = read_small(root / RANKS / name, STATUS_MAX)
        doc = parse_status(raw) if raw is not None else None
        if doc is not None:
            doc["path"] = str(root / RANKS / name)
            out.append(doc)
    return sorted(out, key=lambda s: (int(s["rank"]) if s["rank"].isdigit() else 1 << 30, s["rank"], s["pid"]))


def captures(root: Path) -> list[tuple[int, int, Path]]:
    """(start, end, folder) of every capture folder in `root`, by start step."""
    out = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        m = CAPTURE_DIR.fullmatch(name)
        if m and (root / name).is_dir() and not (root / name).is_symlink():
            out.append((int(m.group(1)), int(m.group(2)), root / name))
    return sorted(out)
