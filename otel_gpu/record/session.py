"""A recorded run: where it goes, what the command's processes are told, how it ends.

`otel-gpu run` with no collector configured (or with `--record DIR`) starts a
`Receiver` in its own process, points every rank's OTLP exporter and pyroscope-io agent (and the
node agent it starts) at it, and closes the store when the command has exited. The ranks run
exactly the code of the OTLP path: same exporter, same sampler, same cost.

The receiver takes requests from this run only: a secret made for the run is given to the ranks
and the node agent in their environment (the OTLP exporters send it as a header through
OTEL_EXPORTER_OTLP_HEADERS / ..._METRICS_HEADERS, the profiler through OTELGPU_RECORD_KEY); it is
never written to a file or printed.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import Failure, UsageError
from ..words import count
from ..identity import job_folder_name, job_name
from ..profiling import RECORD_KEY_HEADER, RECORD_KEY_VAR
from .receiver import PUSH_PATH, Receiver
from .store import DB_NAME, DiskError, Writer

DEFAULT_ROOT = "otel-gpu-runs"
EXPORT_INTERVAL_MS = "1000"   # a recorded run's metric export interval (loopback: cheap)
PROFILE_UPLOAD_S = "2"        # a recorded run's profile push interval: what a crash can lose


def wants_recording(env: Mapping[str, str], pyroscope: str | None) -> bool:
    """Record by default: when no OTLP endpoint is configured (the metrics have nowhere else to go). A
    Pyroscope server alone does not turn recording off: the profiles are recorded and sent on to it.
    (`pyroscope` is kept for the callers: it no longer decides.)"""
    otlp = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return not otlp


def default_job(env: Mapping[str, str], command: Sequence[str]) -> str:
    """The job name: OTELGPU_JOB / Slurm / torchelastic, else the training script's (or command's) name."""
    job = job_name(env)
    if job:
        return job
    words = [w for a in command for w in a.split()]
    script = next((w for w in words if w.endswith(".py")), command[0])
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(script).stem).strip("-") or "run"


def run_dir(root: Path, job: str, now: float) -> Path:
    """`root/<job>-<UTC time>` (a suffix when it exists already): always a direct child of `root`,
    whatever the job name (`job_folder_name`: no '/', no '..', no leading dot, bounded length)."""
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = root / f"{job_folder_name(job)}-{stamp}"
    d, i = base, 1
    while d.exists():
        i += 1
        d = base.with_name(f"{base.name}-{i}")
    return d


def metrics_forward_url(env: Mapping[str, str]) -> str | None:
    """The user's OTLP/HTTP metrics URL, to forward to when recording alongside a collector."""
    specific = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not (specific or base):
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol != "http/protobuf":
        raise UsageError(f"--record with OTLP over {protocol}: set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")
    url = specific or base.rstrip("/") + "/v1/metrics"
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"OTLP endpoint {url!r}: expected a URL starting with http:// or https://")
    return url


def with_header(headers: str, header: str) -> str:
    """An OTEL_EXPORTER_OTLP_*HEADERS value (comma-separated key=value) with `header` added, any
    earlier value of the same key dropped (pure)."""
    key = header.split("=", 1)[0].strip().lower()
    kept = [h for h in headers.split(",") if h.strip() and h.split("=", 1)[0].strip().lower() != key]
    return ",".join([*kept, header])


class RecordingDiskFull(Failure):
    """The recording's disk filled up (or failed) during the run: one line naming the folder."""

    def __init__(self, directory: Path, problem: str, lost_requests: int = 0):
        lost = f", {count(lost_requests, 'export')} not recorded" if lost_requests else ""
        super().__init__(f"recording {relative(directory)} incomplete: {problem}{lost}; what was recorded "
                         f"until then is kept (free space there, then `otel-gpu report {relative(directory)}`)")
        self.directory = directory


class RecordedRun:
    """Owns the run directory, the store and the receiver of one recorded run."""

    def __init__(self, directory: Path, job: str, command: Sequence[str], env: Mapping[str, str],
                 pyroscope: str | None = None):
        forward_metrics = metrics_forward_url(env)
        if (directory / DB_NAME).exists():
            raise UsageError(f"{relative(directory)} already holds a recording: give a new folder to --record "
                             "(two runs in one recording would read as one)")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"cannot write the recording to {directory}: {exc.strerror or exc}") from None
        self.directory, self.job = directory, job
        self.stacks_dir = directory / "stacks"   # where the ranks dump their stacks on request (`stacks.request_stacks`)
        self.started = time.time()
        try:
            self.writer = Writer(directory, {"job": job, "command": json.dumps(list(command)),
                                             "host": socket.gethostname(), "started": repr(self.started)})
        except DiskError as exc:
            raise Failure(f"cannot record in {relative(directory)}: {exc.problem}; free space there (or "
                          "--record DIR on another disk)") from None
        self._key = secrets.token_urlsafe(32)
        self.receiver = Receiver(self.writer, forward_metrics=forward_metrics,
                                 forward_profiles=pyroscope or env.get("OTELGPU_PYROSCOPE_URL") or None,
                                 key=self._key).start()

    def child_env(self, env: Mapping[str, str], profile: bool = True) -> dict[str, str]:
        """The command's environment: every exporter and profiler pointed at the receiver."""
        out = {k: v for k, v in env.items() if k not in ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                                                          "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")}
        out["OTEL_EXPORTER_OTLP_ENDPOINT"] = self.receiver.url
        out["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
        out.setdefault("OTEL_METRIC_EXPORT_INTERVAL", EXPORT_INTERVAL_MS)
        out["OTELGPU_JOB"] = self.job
        header = f"{RECORD_KEY_HEADER}={self._key}"
        out["OTEL_EXPORTER_OTLP_HEADERS"] = with_header(out.get("OTEL_EXPORTER_OTLP_HEADERS", ""), header)
        if out.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "").strip():   # the SDK reads it instead of the above
            out["OTEL_EXPORTER_OTLP_METRICS_HEADERS"] = with_header(out["OTEL_EXPORTER_OTLP_METRICS_HEADERS"], header)
        out[RECORD_KEY_VAR] = self._key
        given = out.get("OTELGPU_STACKS_DIR", "").strip()   # each rank's Python stacks on request (stacks.py)
        if given:
            self.stacks_dir = Path(given)
        else:
            self.stacks_dir.mkdir(exist_ok=True)
            out["OTELGPU_STACKS_DIR"] = str(self.stacks_dir)
        if profile and out.get("OTELGPU_PROFILE", "1").strip().lower() not in ("0", "false", "no", "off"):
            out["OTELGPU_PYROSCOPE_URL"] = self.receiver.url
            out.setdefault("OTELGPU_PROFILE_UPLOAD_S", PROFILE_UPLOAD_S)
        else:
            out.pop("OTELGPU_PYROSCOPE_URL", None)
        return out

    def forward_notes(self) -> list[str]:
        """One line per server the recording sent data on to that failed: what was not sent, why (the
        first failure), how often; the data are in the recording all the same."""
        rx, out = self.receiver, []
        for url, what, where in ((rx.forward_profiles, "profiles", "Pyroscope"),
                                 (rx.forward_metrics, "metrics", "the OTLP endpoint")):
            tried, failed, why = rx.forwarded.get(url, (0, 0, None)) if url else (0, 0, None)
            if not failed:
                continue
            at = f"{where} at {url.removesuffix(PUSH_PATH)}"
            out.append(f"{what} were not sent to {at} ({why}); they are in the recording" if failed == tried else
                       f"{failed} of {tried} sends of {what} to {at} failed (first: {why}); all are in the recording")
        return out

    def finish(self, exit_status: int) -> None:
        """Write the end of the run and close the store (what was queued is written first).

        Raises RecordingDiskFull (one line, exit 1) when the disk was full or failing at any time
        of the run, after closing the store: what was committed until then stays readable."""
        self.receiver.stop()
        failed = self.receiver.disk_error
        try:
            self.writer.set_meta({"ended": repr(time.time()), "exit_status": str(exit_status)})
        except DiskError as exc:
            failed = failed or exc
        try:
            self.writer.close()
        except DiskError as exc:
            failed = failed or exc
        if failed is not None:
            raise RecordingDiskFull(self.directory, failed.problem, self.receiver.counts.lost_requests)


def relative(path: Path) -> str:
    """The path as a user copies it from a message: absolute ("../x.html" breaks once the shell
    moves on; the name is kept for its callers)."""
    return os.path.abspath(path)
