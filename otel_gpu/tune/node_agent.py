"""The node agent beside one trial: `otel-gpu agent` started with the trial's environment, so its
GPU, NIC, host and process readings go where the trial's metrics go (the trial's recording, or the
trial's OTLP endpoint tagged with its trial id), and stopped (flushing) when the trial ends.

As under `otel-gpu run`: the agent gets our package on PYTHONPATH but not the training hooks, stops
by itself when the tuner is gone (`--parent-pid`, and a death signal), and writes its messages to
`agent.log` (the evidence quotes its line about GPUs when there are none).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from .. import children

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S = 8.0     # SIGTERM -> its last export -> exit; then SIGKILL


def agent_env(trial_env: Mapping[str, str], tuner_env: Mapping[str, str]) -> dict[str, str]:
    """The trial's environment without the training hooks on PYTHONPATH (pure)."""
    env = dict(trial_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), tuner_env.get("PYTHONPATH", "")]))
    for key in ("OTELGPU_PYROSCOPE_URL", "OTELGPU_PROFILE_UPLOAD_S"):
        env.pop(key, None)
    return env


def agent_command(extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-c", "import sys; from otel_gpu.cli import main; sys.exit(main())",
            "agent", "--no-live", *extra, f"--parent-pid={os.getpid()}"]


class NodeAgent:
    """`start()` before the trial's command, `stop()` after it (both never raise: a trial runs
    without its agent rather than not at all; `problem` says why)."""

    def __init__(self, env: Mapping[str, str], log: Path, extra: Sequence[str] = ()):
        self.env, self.log, self.extra = dict(env), log, list(extra)
        self.proc: subprocess.Popen | None = None
        self.problem: str | None = None

    def start(self) -> "NodeAgent":
        try:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log, "ab") as out:
                self.proc = children.popen(agent_command(self.extra), env=self.env, stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=out)
        except OSError as exc:
            self.problem = f"node agent not started: {exc.strerror or exc}"
        return self

    def stop(self) -> int | None:
        """SIGTERM (the agent exports once more and exits), SIGKILL after STOP_TIMEOUT_S; its exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.returncode not in (0, -15, 143) and self.problem is None:
            self.problem = f"node agent exited with status {proc.returncode} (see {self.log})"
        return proc.returncode
