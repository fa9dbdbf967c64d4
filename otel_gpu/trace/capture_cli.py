"""`otel-gpu trace capture RUN_DIR --steps K`: a profiler trace of the next K steps of a running job, on
every rank at the same step numbers.

The job runs under `otel-gpu run --record` (its ranks watch RUN_DIR/traces) or with $OTELGPU_TRACE_DIR
set (pass that folder). The command asks every running rank for its step (a poll request; each rank
answers at a step boundary, at most once a second), picks a first step S that every rank is still
before when it sees the capture request (the furthest rank's step now, projected from its step time,
plus the 1 s a rank may take to look and --margin seconds of steps, at least 2), writes the request for
steps S..S+K-1, prints where the
traces will be, and waits (--timeout) until every rank has written its trace or said why not.
Exit 0 when every rank wrote its trace, 1 otherwise (each rank's reason on stderr), 2 on bad input.
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from .. import words
from ..errors import Failure, UsageError
from ..safe_text import visible
from ..values import bounded_int, positive_float
from . import capture_files as cf

POLL_S = 0.1          # how often the statuses are read while waiting
MIN_MARGIN = 2        # steps between the furthest rank and the first captured step, at least
MIN_STEP_S = 1e-6     # a step time below this (s) is taken as this: no rank steps a million times a second


def register(tsub) -> None:
    c = tsub.add_parser("capture", help="capture a profiler trace of the next steps of a running job",
                        description=__doc__)
    c.add_argument("dir", metavar="RUN_DIR", help="the run's folder (`otel-gpu run --record`) or its trace folder")
    c.add_argument("--steps", type=bounded_int(1, cf.MAX_SPAN), required=True,
                   help=f"how many steps to capture (1-{cf.MAX_SPAN})")
    c.add_argument("--timeout", type=positive_float(hi=86400.0), default=300.0, metavar="SECONDS",
                   help="give up after this long (default %(default)g s)")
    c.add_argument("--margin", type=positive_float(hi=3600.0), default=2.0, metavar="SECONDS",
                   help="steps of this much time between the furthest rank and the first captured step, beyond "
                        f"the {cf.CHECK_PERIOD_S:g} s and one step a rank may take to see the request "
                        "(default %(default)g s)")
    c.set_defaults(func=run_capture)


def trace_folder(directory: str | Path) -> Path:
    """The trace folder of a run folder (its traces/) or the folder itself; UsageError when neither has
    ranks registered."""
    d = Path(directory)
    for root in (d / cf.RUN_SUBDIR, d):
        if (root / cf.RANKS).is_dir():
            return root
    raise UsageError(f"{directory}: no ranks registered for trace captures here (no {cf.RUN_SUBDIR}/{cf.RANKS}/): "
                     f"run the job under `otel-gpu run --record`, or give the folder of ${cf.TRACE_DIR}")


def alive(status: dict, proc: str = "/proc") -> bool:
    """The rank's process still runs (its PID with the same start time)."""
    from ..stacks import start_ticks
    return status["start_ticks"] != 0 and start_ticks(status["pid"], proc) == status["start_ticks"]


def choose_start(answers: list[dict], now: float, margin_s: float) -> int:
    """The first step of a capture (pure): past every rank's step projected to `now` from its answer
    (step, time in unix s, median step seconds, taken as at least MIN_STEP_S), by CHECK_PERIOD_S +
    `margin_s` seconds of the fastest rank's steps plus one step (a rank sees the request at its first
    step boundary a check period after its last look), at least MIN_MARGIN steps; never past MAX_STEP."""
    projected, fastest = 0.0, None
    for a in answers:
        step_s = a.get("step_s")
        ahead = 0.0
        if isinstance(step_s, (int, float)) and math.isfinite(step_s) and step_s > 0:
            step_s = max(float(step_s), MIN_STEP_S)
            ahead = min(max(0.0, now - a["time"]) / step_s, cf.MAX_STEP)
            fastest = step_s if fastest is None else min(fastest, step_s)
        projected = max(projected, min(a["step"] + ahead, cf.MAX_STEP))
    ahead_s = cf.CHECK_PERIOD_S + margin_s
    margin = MIN_MARGIN if fastest is None else max(MIN_MARGIN, min(math.ceil(ahead_s / fastest) + 1, cf.MAX_STEP))
    return min(int(projected) + margin + 1, cf.MAX_STEP)


def _ranks_text(statuses: list[dict]) -> str:
    from .grouping import rank_ranges
    ranks = [s["rank"] for s in statuses]
    if all(r.isdigit() for r in ranks):
        return f"{words.noun(len(ranks), 'rank')} {rank_ranges([int(r) for r in ranks])}"
    return f"{words.noun(len(ranks), 'rank')} {', '.join(visible(r) for r in ranks)}"


def _wait(root: Path, pids: dict[int, dict], done, deadline: float) -> tuple[dict[int, dict], dict[int, dict]]:
    """Read the statuses until `done(status)` holds for every rank in `pids` (or it is gone) or the deadline:
    ({pid: status done}, {pid: latest status of the others})."""
    finished: dict[int, dict] = {}
    latest = dict(pids)
    while True:
        for s in cf.read_statuses(root):
            if s["pid"] in pids and s["pid"] not in finished:
                latest[s["pid"]] = s
                if done(s):
                    finished[s["pid"]] = s
        left = {p: s for p, s in latest.items() if p not in finished}
        if not left or time.monotonic() >= deadline:
            return finished, left
        if not any(alive(s) for s in left.values()):
            return finished, left
        time.sleep(POLL_S)


def run_capture(args) -> int:
    root = trace_folder(args.dir)
    deadline = time.monotonic() + args.timeout
    ranks = {s["pid"]: s for s in cf.read_statuses(root) if alive(s)}
    if not ranks:
        raise Failure(f"{args.dir}: no running rank is registered for trace captures (the job has ended, or has "
                      "not started training yet)")
    poll = os.urandom(8).hex()
    try:
        cf.write_whole(root / cf.REQUEST, cf.request_text(poll, "poll"))
    except OSError as exc:
        raise Failure(f"cannot write the request in {root}: {exc.strerror or exc}") from None
    answered, silent = _wait(root, ranks, lambda s: s.get("answered") == poll, deadline)
    if silent:
        gone = [s for s in silent.values() if not alive(s)]
        quiet = [s for s in silent.values() if alive(s)]
        why = ([f"{_ranks_text(gone)} ended"] if gone else []) + \
              ([f"{_ranks_text(quiet)} did not answer within {args.timeout:g} s (a rank answers at a step boundary)"]
               if quiet else [])
        raise Failure(f"no capture requested: {'; '.join(why)}")
    start = choose_start(list(answered.values()), time.time(), args.margin)
    end = min(start + args.steps - 1, cf.MAX_STEP)
    request = os.urandom(8).hex()
    try:
        cf.write_whole(root / cf.REQUEST, cf.request_text(request, "capture", start, end))
    except OSError as exc:
        raise Failure(f"cannot write the request in {root}: {exc.strerror or exc}") from None
    folder = root / cf.capture_name(start, end)
    print(f"otel-gpu trace capture: steps {start}-{end} on {_ranks_text(list(answered.values()))} "
          f"(now at step {max(s['step'] for s in answered.values())}); traces: {folder}", flush=True)
    finished, left = _wait(root, ranks, lambda s: s.get("request") == request and s["state"] in cf.FINAL, deadline)
    problems = []
    for s in finished.values():
        if s["state"] != cf.WRITTEN:
            problems.append(f"rank {visible(s['rank'])}: {visible(str(s.get('message', ''))[:300])}")
    for s in left.values():
        state = "ended" if not alive(s) else f"timed out after {args.timeout:g} s"
        problems.append(f"rank {visible(s['rank'])}: {state} at step {s['step']} ({visible(s['state'])}) "
                        f"before its trace of steps {start}-{end} was written")
    for line in problems:
        print(f"otel-gpu trace capture: {line}", file=sys.stderr)
    written = len(finished) - sum(1 for s in finished.values() if s["state"] != cf.WRITTEN)
    print(f"otel-gpu trace capture: {written} of {words.count(len(ranks), 'trace')} written in {folder}"
          + ("" if not written else f"; analyse them with `otel-gpu trace analyze {folder}`"), flush=True)
    return 0 if not problems else 1
