"""The end of `otel-gpu run`: each analysed capture's GPU time by launching code pushed to the Pyroscope
server the ranks' CPU profiles go to, as `otel-gpu trace analyze --push` pushes it (:mod:`.gpu_push`).

Per capture, one profile per rank with GPU time, labelled as that rank's CPU profiles are: the same
``service_name`` and ``job`` (worked out from the ranks' environment as each rank does, :func:`identity`)
and its ``rank``; profile type ``gpu_time``. Each profile covers the rank's captured steps in wall time
(:func:`window`: its pprof time and duration, Pyroscope's from/until). The pushes of a run share one
deadline (PUSH_TIMEOUT_S): a server down or slow is one line, the results on disk stay, and the run's
exit status is not touched.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from .. import words
from ..safe_text import visible
from . import capture_files as cf

PUSH_TIMEOUT_S = 10.0   # seconds for all the pushes at the end of a run together


@dataclass(frozen=True)
class Target:
    url: str                # the Pyroscope server (its base URL)
    service_name: str       # as the ranks' CPU profiles
    job: str | None


def identity(env: Mapping[str, str]) -> tuple[str, str | None]:
    """(service_name, job) of the CPU profiles of a rank started with `env` (pure): the job as the rank
    takes it (`OTELGPU_JOB`, Slurm, torchelastic; `OTEL_RESOURCE_ATTRIBUTES`' otelgpu.job on top), the
    service name from `OTEL_SERVICE_NAME`, else the job (`profiling.service_name`)."""
    from ..export import resource_attributes_without_sdk
    from ..identity import job_name
    from ..names import JOB
    from ..profiling import service_name

    job = job_name(env)
    merged = resource_attributes_without_sdk({JOB: job} if job else {}, env)
    if merged is not None:
        job = merged.get(JOB) or None
    return service_name(env, job), job


def target(url: str | None, no_profile: bool, env: Mapping[str, str]) -> tuple[Target | None, str | None]:
    """Where `run` pushes its captures' GPU time: (Target, None) with a Pyroscope URL and profiles on;
    (None, why not) with a URL and profiles off; (None, None) without a URL (pure). `env`: the ranks'."""
    from ..values import SWITCH_OFF

    if not url:
        return None, None
    if no_profile:
        return None, "profiles are off (--no-profile)"
    if env.get("OTELGPU_PROFILE", "1").strip().lower() in SWITCH_OFF:
        return None, "profiles are off (OTELGPU_PROFILE)"
    name, job = identity(env)
    return Target(url, name, job), None


def _seconds(v) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return float(v) if ok else None


def window(written_s: float, steps: tuple[int, int], status: dict | None,
           median_step_s: float | None) -> tuple[int, int]:
    """A rank's captured steps in wall time: (start, duration), ns since the epoch (pure). The capture
    ended when step E closed: `written_s` (its trace file's modification time, s) less the stop, export
    and write its status gives for this capture (`stop_parts_s`). Its length: the captured steps by the
    rank's own step timer (`captured_step_s`), else the trace's median step times their number, else 0.
    `status`: the rank's status for this capture (its window), or None."""
    n = steps[1] - steps[0] + 1
    parts = status.get("stop_parts_s") if status else None
    after = sum(s for s in map(_seconds, parts.values()) if s is not None) if isinstance(parts, dict) else 0.0
    captured = status.get("captured_step_s") if status else None
    spans = [_seconds(v) for v in captured] if isinstance(captured, list) else []
    if len(spans) == n and None not in spans:
        span = sum(spans)
    else:
        span = n * (_seconds(median_step_s) or 0.0)
    end = written_s - min(after, written_s)
    span = min(span, end)   # damaged figures: the window stays within [0, written_s]
    return int(round((end - span) * 1e9)), int(round(span * 1e9))


def _status_for(statuses: list[dict], rank: int, steps: tuple[int, int]) -> dict | None:
    """The rank's latest status that wrote this capture."""
    mine = [s for s in statuses if s["rank"] == str(rank) and s["state"] == cf.WRITTEN
            and s.get("window") == list(steps)]
    return max(mine, key=lambda s: s["time"]) if mine else None


def _windows(root: Path, c: dict, ranks, statuses: list[dict]) -> dict[int, tuple[int, int]]:
    """Rank -> its window (`window`) for the ranks whose trace file can be stat'ed."""
    steps = (c["steps"][0], c["steps"][1])
    out = {}
    for rank in ranks:
        rel = c.get("files", {}).get(str(rank))
        try:
            written = os.stat(root / rel).st_mtime if isinstance(rel, str) else None
        except OSError:
            written = None
        if written is None:
            continue
        median = (c.get("step_times", {}).get(str(rank)) or [None])[0]
        out[rank] = window(written, steps, _status_for(statuses, rank, steps), median)
    return out


def _again(folder: Path, where: Target) -> str:
    """The command that pushes a capture's GPU time by hand, with the same labels."""
    from shlex import quote

    return visible(f"otel-gpu trace analyze {quote(str(folder))} --include-last-step --quiet --push {quote(where.url)} "
                   f"--service-name {quote(where.service_name)}" + (f" --job {quote(where.job)}" if where.job else ""))


def push_captures(root: Path, summary: dict, where: Target, timeout_s: float | None = None,
                  clock: Callable[[], float] = time.monotonic) -> list[str]:
    """Push the GPU time of every analysed capture in `summary` (finish_run's, for trace folder `root`),
    all within `timeout_s` (default PUSH_TIMEOUT_S); one line per capture to print. After a failed push
    the later captures are not tried (said in the same line). Never raises for a server's fault."""
    from .gpu_push import PushError, push, push_body
    from .run_traces import load_gpu_time

    root = Path(root)
    statuses = cf.read_statuses(root)
    deadline = clock() + (PUSH_TIMEOUT_S if timeout_s is None else timeout_s)
    captures = [c for c in summary.get("captures", []) if not c.get("error")]
    lines = []
    for i, c in enumerate(captures):
        name = f"trace of steps {c['steps'][0]}-{c['steps'][1]}"
        rel = c.get("gpu_time")
        if not rel:
            lines.append(f"{name}: nothing pushed to Pyroscope: no GPU time in the trace (CPU-only)")
            continue
        # load_gpu_time reads <run>/traces/<rel>: an absolute path (no "..") names the file wherever it is
        per_rank = load_gpu_time(root, {"captures": [{"gpu_time": os.path.abspath(root / rel)}]})
        if not per_rank:
            lines.append(f"{name}: GPU time not pushed to Pyroscope: {root / rel} could not be read")
            continue
        body = push_body(per_rank, where.service_name, where.job, windows=_windows(root, c, per_rank, statuses))
        try:
            push(where.url, body, timeout_s=max(0.1, deadline - clock()))
        except PushError as exc:
            rest = len(captures) - i - 1
            lines.append(f"{name}: GPU time not pushed to Pyroscope: {exc}"
                         + (f"; {words.count(rest, 'later capture')} not tried" if rest else "")
                         + f" (kept in {root / rel}; `{_again(root / c['folder'], where)}` pushes it again)")
            break
        lines.append(f"{name}: GPU time by launching code pushed to Pyroscope at {where.url} "
                     f"({words.count(len(per_rank), 'rank')}, service_name {visible(where.service_name)}"
                     + (f", job {visible(where.job)}" if where.job else "") + ", profile type gpu_time)")
    return lines
