"""One trial of the user's launch command: own folder, own process group, wall-clock timeout.

The command runs under `/bin/sh -c` in a new session (so its process group holds torchrun,
the deepspeed launcher and every rank); stopping a trial signals the whole group: SIGTERM,
then SIGKILL after a grace period. While a trial runs the tuner is a child subreaper, so a trial
process that leaves the group (setsid, a double fork) is re-parented to the tuner rather than init;
when the trial ends, every process it started that is still alive is ended the same way.
Output goes to `output.log` in the trial folder.
How a trial ended is classified from its exit status and the tail of its log (`classify`).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from .. import children

OK, PRUNED, TIMEOUT, OOM, CRASH, REJECTED, INCOMPLETE, OVER_MEMORY, INTERRUPTED = (
    "ok", "pruned", "timeout", "oom", "crash", "rejected", "incomplete", "over-memory", "interrupted")
HANG = "hang"   # timed out before its first training step (a start-up hang)
LOG_NAME = "output.log"
TAIL_BYTES = 64 * 1024

_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
                  r"std::bad_alloc|Cannot allocate memory|HIP out of memory|MemoryError", re.I)
_REJECTED = re.compile(r"validation errors? for DeepSpeed\w*Config|DeepSpeedConfigError|"
                       r"Check batch related parameters|mismatch TrainingArguments values", re.I)
_EXCEPTION = re.compile(r"(?:^|(?<=[\s\]):]))([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b:?.*)$", re.M)


@dataclass
class TrialPlan:
    """What to run: `command` is the shell command with placeholders already filled in."""

    number: int
    trial_id: str                 # the value of the trial label on the trial's metrics
    directory: Path
    command: str
    env: Mapping[str, str]
    timeout_s: float
    grace_s: float = 10.0         # SIGTERM -> SIGKILL
    cwd: str | None = None


@dataclass
class TrialRun:
    """How the process ended. `started`/`ended` are unix seconds."""

    status: str
    reason: str
    returncode: int | None
    started: float
    ended: float
    pgid: int | None = None
    log_tail: str = field(default="", repr=False)

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def render_command(template: str, config_path: Path, trial_dir: Path, number: int, trial_id: str) -> str:
    """Fill `{config}`, `{trial_dir}`, `{trial}` (number) and `{trial_id}` in `template`, each quoted
    for where it stands: outside quotes, inside the user's own "..." or '...' (`fill_quoted`)."""
    values = {"config": str(config_path), "trial_dir": str(trial_dir), "trial": str(number), "trial_id": trial_id}
    return fill_quoted(template, values)


_PLACEHOLDER = re.compile(r"\{(config|trial_dir|trial|trial_id)\}")


def fill_quoted(template: str, values: dict[str, str]) -> str:
    """`template` (POSIX shell) with each `{name}` of `values` replaced so that the shell reads
    exactly the value there: shell-quoted outside quotes; inside double quotes with `\\`, `"`, `$`
    and `` ` `` escaped; inside single quotes with each `'` as `'\\''` (pure)."""
    out, i, state = [], 0, ""   # state: "" outside quotes, "'" or '"' inside them
    while i < len(template):
        m = _PLACEHOLDER.match(template, i)
        if m is not None:
            value = values[m.group(1)]
            if state == "":
                out.append(shlex.quote(value))
            elif state == '"':
                out.append(re.sub(r'([\\"$`])', r"\\\1", value))
            else:
                out.append(value.replace("'", "'\\''"))
            i = m.end()
            continue
        c = template[i]
        out.append(c)
        if c == "\\" and state != "'" and i + 1 < len(template):   # an escaped character: taken as it is
            out.append(template[i + 1])
            i += 2
            continue
        if state == "" and c in "'\"":
            state = c
        elif c == state:
            state = ""
        i += 1
    return "".join(out)


def check_template(template: str) -> str | None:
    """Why `template` cannot be used (None: fine)."""
    if "{config}" not in template:
        return "the command must contain {config} (replaced by the trial's generated DeepSpeed config)"
    try:
        shlex.split(template)
    except ValueError as exc:
        return f"the command is not valid shell syntax: {exc}"
    return None


def classify(returncode: int | None, log_tail: str, *, timed_out: bool = False,
             stop_reason: str | None = None, timeout_s: float | None = None) -> tuple[str, str]:
    """(status, reason) of a finished trial process (pure)."""
    if stop_reason:
        return PRUNED, stop_reason
    if timed_out:
        return TIMEOUT, f"no exit within the {timeout_s:g} s trial timeout; process group killed"
    if returncode == 0:
        return OK, "exited 0"
    line = _last_exception(log_tail)
    if _OOM.search(log_tail):
        return OOM, line or "out of memory"
    if _REJECTED.search(log_tail):
        return REJECTED, line or "DeepSpeed rejected the config"
    if returncode is not None and returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return OOM, "killed by SIGKILL without being asked (most often the kernel's OOM killer)"
    if returncode is not None and returncode < 0:
        return CRASH, f"killed by signal {signal.Signals(-returncode).name}" + (f": {line}" if line else "")
    return CRASH, f"exit status {returncode}" + (f": {line}" if line else "")


def startup_hang_reason(timeout_s: float, stuck_on: str | None, log_tail: str) -> str:
    """Why a trial that reached no training step before its timeout is a start-up hang (pure):
    what it was seen stuck on, else its last line of output."""
    reason = f"start-up hang: no training step within the {timeout_s:g} s trial timeout; process group killed"
    if stuck_on:
        return f"{reason}; {stuck_on}"
    lines = [" ".join(line.split()) for line in log_tail.replace("\r", "\n").splitlines() if line.strip()]
    return f"{reason}; last output: {lines[-1][:200]}" if lines else f"{reason}; no output at all"


def _last_exception(text: str) -> str:
    found = _EXCEPTION.findall(text.replace("\r", "\n"))
    for candidate in reversed(found):
        if "ChildFailedError" not in candidate:
            return " ".join(candidate.split())[:240]
    return " ".join(found[-1].split())[:240] if found else ""


def read_tail(path: Path, size: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def kill_group(pgid: int, grace_s: float, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group, SIGKILL it after `grace_s` if anything is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if leader is not None:
        leader.wait()
    deadline = time.monotonic() + 5.0       # SIGKILLed processes take a moment to exit
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies aside) is left in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(pgid_of(pid) == pgid and not _zombie(pid) for pid in _pids())


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()] if os.path.isdir("/proc") else []


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pgid_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[2]) if fields else None


def _zombie(pid: int) -> bool:
    fields = _stat(pid)
    return fields is None or fields[0] == "Z"


def environ_value(pid: int, key: str) -> str | None:
    """`key` in the environment process `pid` started with (None: not set, or not readable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return None
    prefix = key.encode() + b"="
    return next((i[len(prefix):].decode(errors="replace") for i in items if i.startswith(prefix)), None)


def group_is_trial(pgid: int, leader_start: int | None, trial_id: str | None) -> bool:
    """Whether process group `pgid` still runs trial `trial_id`: its leader alive (or not yet reaped)
    with the start time recorded, or, the leader gone, a live member whose environment carries the
    trial's id. The leader often goes first: the tuner's death signal ends the `/bin/sh` wrapper while
    the ranks it started run on. A pgid is not reused while any member of the group is alive."""
    start = start_time(pgid)
    if start is not None:
        return start == leader_start
    return bool(trial_id) and any(pgid_of(pid) == pgid and not _zombie(pid)
                                  and environ_value(pid, TRIAL_ENV) == trial_id for pid in _pids())


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def run_trial(plan: TrialPlan, monitor: Callable[[], str | None] | None = None,
              poll_s: float = 1.0, on_start: Callable[[int], None] | None = None,
              on_timeout: Callable[[int], None] | None = None) -> TrialRun:
    """Run the plan to its end. `monitor()` is called every `poll_s`; a string it returns stops
    the trial as pruned with that reason. `on_timeout(pgid)` runs when the timeout hits, before
    the group is killed (to see what it was stuck on). KeyboardInterrupt (or SystemExit) kills
    the group and propagates."""
    plan.directory.mkdir(parents=True, exist_ok=True)
    log_path = plan.directory / LOG_NAME
    with children.subreaper():   # a trial process that daemonizes (setsid, double fork) stays below us
        tracker = children.Tracker()
        started = time.time()
        with open(log_path, "ab") as log:
            proc = children.popen(["/bin/sh", "-c", plan.command], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=dict(plan.env), cwd=plan.cwd,
                                    start_new_session=True)
        pgid = proc.pid
        timed_out, stop_reason = False, None
        try:
            if on_start is not None:
                on_start(pgid)
            deadline = time.monotonic() + plan.timeout_s
            while proc.poll() is None:
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    if on_timeout is not None:
                        on_timeout(pgid)
                    break
                if monitor is not None:
                    stop_reason = monitor()
                    if stop_reason:
                        break
                try:
                    proc.wait(timeout=min(poll_s, max(0.01, deadline - now)))
                except subprocess.TimeoutExpired:
                    tracker.reap_orphans(keep=[proc.pid])
        finally:
            if proc.poll() is None or group_alive(pgid):
                kill_group(pgid, plan.grace_s, proc)
            proc.wait()
            children.end(tracker.new(), plan.grace_s)   # what left the group: daemons, double forks
            tracker.reap_orphans()
    ended = time.time()
    tail = read_tail(log_path)
    status, reason = classify(proc.returncode, tail, timed_out=timed_out, stop_reason=stop_reason,
                              timeout_s=plan.timeout_s)
    return TrialRun(status, reason, proc.returncode, started, ended, pgid, tail)


TRIAL_ATTRIBUTE = "otelgpu.trial"       # resource attribute; label `otelgpu_trial` in Prometheus
TRIAL_LABEL = "otelgpu_trial"
TRIAL_ENV = "OTELGPU_TRIAL"             # every trial process's environment names its trial


def trial_env(base: Mapping[str, str], trial_id: str, *, instrument: bool = True,
              export_interval_ms: int | None = 1000, otlp_endpoint: str | None = None) -> dict[str, str]:
    """The trial's environment: its id as an OTel resource attribute (so every metric it exports
    carries `otelgpu_trial`), `OTELGPU_TRIAL`, a short export interval unless one is set, and with
    `instrument` the zero-code-change hooks of `otel-gpu run` on PYTHONPATH."""
    env = dict(base)
    if otlp_endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
    attrs = [a for a in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
             if a.strip() and a.split("=", 1)[0].strip() != TRIAL_ATTRIBUTE]
    env["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(attrs + [f"{TRIAL_ATTRIBUTE}={trial_id}"])
    env[TRIAL_ENV] = trial_id
    if export_interval_ms and not env.get("OTEL_METRIC_EXPORT_INTERVAL"):
        env["OTEL_METRIC_EXPORT_INTERVAL"] = str(int(export_interval_ms))
    if instrument:
        from ..run_cli import child_env
        env = child_env(env)
    return env
