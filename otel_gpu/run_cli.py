"""`otel-gpu run [--pyroscope URL] [--no-profile] -- COMMAND...`: telemetry without code change.

Every Python process the command starts (python, torchrun, deepspeed, llamafactory-cli
and their ranks) imports our `sitecustomize` from PYTHONPATH, which instruments torch
optimizers, the HF Trainer, DeepSpeed engines and Lightning as they are imported.
The command's exit status is returned unchanged (a signal death N as 128 + N).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from .errors import UsageError
from .values import url_type

SITE_DIR = Path(__file__).resolve().parent / "training" / "_site"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OTLP = "http://localhost:4318"   # the OTLP/HTTP default of every OpenTelemetry SDK


def register(sub) -> None:
    p = sub.add_parser("run", help="run a training command with step/phase metrics and profiling in every rank",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pyroscope", metavar="URL", type=url_type(), help="Pyroscope server to stream profiles to (else $OTELGPU_PYROSCOPE_URL)")
    p.add_argument("--no-profile", action="store_true", help="metrics only, no profiling")
    p.add_argument("--job", type=_job_name, help="job name on every series and profile (else $OTELGPU_JOB, Slurm or torchelastic)")
    p.add_argument("--agent", action="store_true", help="also run the node agent (`otel-gpu agent`) for the command's lifetime")
    p.add_argument("--agent-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the node agent (repeatable), e.g. --agent-arg=--no-gpu")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="the training command, after --")
    p.set_defaults(func=run)


def _job_name(text: str) -> str:
    """argparse type: a job name, one line of printable text."""
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"{text!r}: expected a non-empty name without control characters")
    return text.strip()


def check_agent_args(extra: list[str], env: Mapping[str, str]) -> None:
    """Validate the node agent's --agent-arg flags and OTELGPU_* settings here, before the command
    starts, so a typo is exit 2 now rather than a training run without its agent."""
    from .agent import cli as agent_cli

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):
            raise UsageError(f"--agent-arg: {message}")

    parser = Parser(prog="otel-gpu")
    agent_cli.register(parser.add_subparsers(dest="subcommand"))
    agent_cli.agent_config(parser.parse_args(["agent", "--no-live", *extra]), env, stdout_is_tty=False)


def child_env(env: Mapping[str, str], pyroscope: str | None = None, no_profile: bool = False,
              job: str | None = None) -> dict[str, str]:
    """The command's environment: our sitecustomize first on PYTHONPATH, the settings as variables."""
    out = dict(env)
    paths = [str(SITE_DIR), str(PACKAGE_ROOT)] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if not (out.get("OTEL_EXPORTER_OTLP_ENDPOINT") or out.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")):
        out["OTEL_EXPORTER_OTLP_ENDPOINT"] = DEFAULT_OTLP
    if pyroscope:
        out["OTELGPU_PYROSCOPE_URL"] = pyroscope
    if no_profile:
        out["OTELGPU_PROFILE"] = "0"
    if job:
        out["OTELGPU_JOB"] = job
    return out


def exit_status(returncode: int) -> int:
    """subprocess return code -> shell exit status (a signal N is 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def run(args) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise UsageError("no command given: otel-gpu run [options] -- COMMAND...")
    if shutil.which(command[0]) is None and not Path(command[0]).is_file():
        raise UsageError(f"command not found: {command[0]}")
    env = child_env(os.environ, args.pyroscope, args.no_profile, args.job)
    if args.agent:
        check_agent_args(args.agent_arg, env)
    agent = _start_agent(args.agent_arg, env) if args.agent else None
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:
        _stop(agent)
        raise UsageError(f"cannot start {command[0]}: {exc.strerror or exc}") from None
    forwarded = {s: signal.signal(s, lambda num, frame: proc.send_signal(num)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = proc.wait()
    finally:
        for s, handler in forwarded.items():
            signal.signal(s, handler)
        _stop(agent)
    return exit_status(returncode)


def _start_agent(extra: list[str], env: Mapping[str, str]) -> subprocess.Popen | None:
    agent_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    agent_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-c", "import sys; from otel_gpu.cli import main; sys.exit(main())",
           "agent", "--no-live", *extra]
    try:
        return subprocess.Popen(cmd, env=agent_env, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"otel-gpu run: node agent not started: {exc}", file=sys.stderr)
        return None


def _stop(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
