"""`otel-gpu run [--record DIR] [--pyroscope URL] [--no-profile] -- COMMAND...`: telemetry without code change.

With no OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) configured, the run is recorded: metrics of
every rank and of the node agent, and every rank's profiles, go to loopback receivers that write
./otel-gpu-runs/<job>-<UTC time>/ (or --record DIR); at the end a report (report.html) is written
and a short summary printed. With --pyroscope the profiles are also sent on to it; --record with a
collector configured records and forwards to it; a server that failed is named in one line at the
end. --no-record keeps the plain OTLP behaviour.

Every Python process the command starts (python, torchrun, deepspeed, llamafactory-cli
and their ranks) imports our `sitecustomize` from PYTHONPATH, which instruments torch
optimizers, the HF Trainer, DeepSpeed engines and Lightning as they are imported.
The command's exit status is returned unchanged (a signal death N as 128 + N).
SIGINT, SIGTERM and SIGHUP are forwarded to the command; one that has not exited --grace seconds
(default 10) after SIGTERM or SIGHUP is killed with its processes (SIGKILL). Processes the command
leaves running when it exits are ended (SIGTERM, SIGKILL after the grace period). If otel-gpu run
itself is killed, the node agent and the command get SIGTERM from the kernel, and a guard process
ends every process the run had started (tree_guard.py), whatever it did to its credentials.
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

from . import children, words
from .errors import UsageError
from .trace.capture_files import TRACE_DIR, TRACE_STACKS, TRACE_STEPS, parse_steps
from .values import flag_type, number, switch, url_type

SITE_DIR = Path(__file__).resolve().parent / "training" / "_site"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OTLP = "http://localhost:4318"   # the OTLP/HTTP default of every OpenTelemetry SDK


def register(sub) -> None:
    p = sub.add_parser("run", help="run a training command with step/phase metrics and profiling in every rank",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pyroscope", metavar="URL", type=url_type(),
                   help="Pyroscope server to stream profiles to, and the traces' GPU time at the end "
                        "(else $OTELGPU_PYROSCOPE_URL)")
    p.add_argument("--no-profile", action="store_true", help="metrics only, no profiling")
    p.add_argument("--job", type=_job_name, help="job name on every series and profile (else $OTELGPU_JOB, Slurm or torchelastic)")
    p.add_argument("--record", metavar="DIR", help="record the run into DIR (default when no collector is configured: "
                                                   "./otel-gpu-runs/<job>-<UTC time>)")
    p.add_argument("--no-record", action="store_true", help="never record; export over OTLP as configured")
    p.add_argument("--no-report", action="store_true", help="record, but write no report at the end")
    p.add_argument("--no-live", action="store_true", help="when recording: print no findings while the job runs "
                                                          "(by default a finding that appears, changes or clears "
                                                          "is one line on stderr, at most 6 a minute)")
    p.add_argument("--thresholds", metavar="FILE", help="threshold overrides (.toml, .yaml, as `otel-gpu diagnose "
                                                        "--thresholds`) for the findings while the job runs")
    p.add_argument("--agent", action="store_true", help="also run the node agent (`otel-gpu agent`) for the command's "
                                                        "lifetime (always, when recording)")
    p.add_argument("--no-agent", action="store_true", help="when recording: do not start the node agent")
    p.add_argument("--agent-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the node agent (repeatable), e.g. --agent-arg=--no-gpu")
    p.add_argument("--grace", metavar="SECONDS", type=grace_type, default=children.DEFAULT_GRACE_S,
                   help="after SIGTERM or SIGHUP, wait this long (0-3600 s, default %(default)g) for the command "
                        "before killing it and its processes (SIGKILL)")
    p.add_argument("--trace-steps", metavar="A-B", type=flag_type(parse_steps),
                   help="every rank records steps A to B (counted from 1) with the PyTorch profiler into the run's "
                        "traces/ (not recording: $OTELGPU_TRACE_DIR, else ./otel-gpu-traces/<job>-<UTC time>/), "
                        "analysed at the end as by `otel-gpu trace analyze` (else $OTELGPU_TRACE_STEPS)")
    p.add_argument("--trace-stacks", metavar="1|0", type=flag_type(switch),
                   help="Python stacks in the traces: 1 or 0 (else $OTELGPU_TRACE_STACKS, default 0: torch's Python tracer "
                        "can crash a rank as it starts, docs/capture.md)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="the training command, after --")
    p.set_defaults(func=run)


def _job_name(text: str) -> str:
    """argparse type: a job name, one line of printable text."""
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"{text!r}: expected a non-empty name without control characters")
    return text.strip()


grace_type = flag_type(number, lo=0.0, hi=3600.0)   # --grace: seconds, finite, 0 - 3600


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
    if not out.get("PYTHONFAULTHANDLER", "").strip():   # a crash (SIGSEGV in a library) leaves every thread's stack
        out["PYTHONFAULTHANDLER"] = "1"
    return out


def not_runnable(name: str) -> tuple[int, str] | None:
    """(exit status, one line) when a shell could not run the command `name`: 127 when it is not
    found (no such file, or not on PATH), 126 when it is found but cannot be run (a folder, not
    executable); None when it can be started."""
    if "/" not in name:
        return None if shutil.which(name) is not None else (127, f"command not found: {name}")
    path = Path(name)
    if not path.exists():
        return 127, f"{name}: no such file"
    if path.is_dir():
        return 126, f"{name}: is a folder"
    if not os.access(path, os.X_OK):
        return 126, f"{name}: permission denied (not executable)"
    return None


def exit_status(returncode: int) -> int:
    """subprocess return code -> shell exit status (a signal N is 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def run(args) -> int:
    from .tree_guard import guarding

    # before any child starts; the guard ends the processes left if run itself is killed
    with children.SignalLatch() as latch, children.subreaper(), guarding():
        return _run(args, latch)


def _run(args, latch: children.SignalLatch) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise UsageError("no command given: otel-gpu run [options] -- COMMAND...")
    unrunnable = not_runnable(command[0])
    if unrunnable is not None:   # as a shell says it: 127 not found, 126 found but not executable
        print(f"otel-gpu run: {unrunnable[1]}", file=sys.stderr, flush=True)
        return unrunnable[0]
    if args.record and args.no_record:
        raise UsageError("give either --record or --no-record, not both")
    if args.thresholds:   # a bad file is exit 2 now, not a silent watcher later
        from .diagnose.thresholds import ThresholdError, load_thresholds
        try:
            load_thresholds(args.thresholds)
        except ThresholdError as exc:
            raise UsageError(str(exc)) from None
        args.thresholds = os.path.abspath(args.thresholds)
    record = bool(args.record or (not args.no_record and _record_by_default(os.environ, args.pyroscope)))
    start_agent = args.agent or (record and not args.no_agent)
    base = dict(os.environ)
    if args.trace_steps:   # the flag wins over $OTELGPU_TRACE_STEPS
        base[TRACE_STEPS] = "%d-%d" % args.trace_steps
    if args.trace_stacks is not None:   # and over $OTELGPU_TRACE_STACKS
        base[TRACE_STACKS] = "1" if args.trace_stacks else "0"
    from .settings_check import check_run_environment   # every OTELGPU_* value the ranks read: exit 2 now
    check_run_environment(child_env(base, args.pyroscope, args.no_profile, args.job))
    wanted = parse_steps(base[TRACE_STEPS]) if base.get(TRACE_STEPS, "").strip() else None
    if start_agent:   # before anything starts: a bad --agent-arg is exit 2 with nothing left behind
        check_agent_args(args.agent_arg, child_env(base, args.pyroscope, args.no_profile, args.job))
    pyroscope = args.pyroscope or os.environ.get("OTELGPU_PYROSCOPE_URL", "").strip()
    if pyroscope and not record and not args.no_profile:   # the ranks push there themselves, silently
        from .export_errors import unreachable
        why = unreachable(pyroscope)
        if why:
            print(f"otel-gpu run: Pyroscope at {pyroscope} is not reachable ({why}): profiles will not be sent",
                  file=sys.stderr, flush=True)
    if latch.stopping is not None:
        return 128 + latch.stopping
    recorded = None
    if record:
        recorded = _start_recording(args, command)
        env = recorded.child_env(child_env(base, args.pyroscope, args.no_profile, recorded.job),
                                 profile=not args.no_profile)
        env[TRACE_DIR] = str(recorded.directory / "traces")   # captures on request (`otel-gpu trace capture`)
    else:
        env = child_env(base, args.pyroscope, args.no_profile, args.job)
        if wanted:   # this run's own folder, unless one is given: the end analyses what is in it
            env[TRACE_DIR] = os.path.abspath(env.get(TRACE_DIR, "").strip() or _trace_folder(args.job, command))
    agent_log = recorded.directory / "agent.log" if recorded is not None else None
    agent = _start_agent(args.agent_arg, env, agent_log) if start_agent and latch.stopping is None else None
    tracker = children.Tracker()
    proc = None
    try:
        if latch.stopping is None:
            proc = children.popen(command, env=env)
    except OSError as exc:
        _stop(agent)
        status = 127 if isinstance(exc, FileNotFoundError) else 126   # as a shell would
        if recorded is not None:
            recorded.finish(status)
        print(f"otel-gpu run: cannot start {command[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return status
    live = None
    if recorded is not None and proc is not None and not args.no_live:
        from .run_live import LiveFindings
        live = LiveFindings(recorded.directory, _own_env(env), thresholds=args.thresholds,
                            on_stall=lambda e: _stall_stacks(recorded.stacks_dir)).start()
    warm = None
    if recorded is not None and not args.no_report and proc is not None:
        # import the report's code while the command runs; started after the children, so no fork (and its
        # preexec_fn) happens while this thread holds the import lock
        import importlib
        import threading
        warm = threading.Thread(target=importlib.import_module, args=("otel_gpu.report.build",), daemon=True)
        warm.start()
    try:
        if proc is None:   # a signal came while things were starting: the command never ran
            returncode = -latch.stopping
        else:
            latch.forward(proc.send_signal)
            returncode = _wait(proc, latch, args.grace, tracker,
                               keep=[p for p in (proc.pid, agent and agent.pid, live and live.pid) if p])
    finally:
        if live is not None:
            live.stop()
        _end_leftovers(tracker, agent, args.grace)
        _stop(agent)
    status = exit_status(returncode)
    from .trace.run_push import target   # each capture's GPU time, to the Pyroscope server the CPU profiles go to
    push = target(pyroscope, args.no_profile, env)
    traces = (lambda: _traces_at_end(Path(env[TRACE_DIR]), wanted, *push)) if proc is not None else None
    if recorded is None and traces is not None and wanted:
        traces()
    if recorded is not None:
        if warm is not None:
            warm.join()
        status = _finish_recording(recorded, status, report=not args.no_report and proc is not None, traces=traces)
    return status


def _trace_folder(job: str | None, command: list[str]) -> Path:
    """./otel-gpu-traces/<job>-<UTC time>/: where an unrecorded run's captures go."""
    import time

    from .record.session import default_job, run_dir
    return run_dir(Path("otel-gpu-traces"), job or default_job(os.environ, command), time.time())


def _traces_at_end(root: Path, wanted: tuple[int, int] | None, push=None, no_push: str | None = None) -> None:
    """Every profiler capture of the run analysed (`trace.run_traces`); one line each, and one per capture
    not made; with `push` (a `run_push.Target`) each capture's GPU time pushed to Pyroscope, one line each
    (`no_push`: why it is not, said once). A failure here is one line: the job's own status is not touched."""
    summary = None
    try:
        from .trace.run_traces import finish_run
        summary, lines = finish_run(root, wanted)
    except Exception as exc:  # the traces stay on disk for `otel-gpu trace analyze`
        lines = [f"the traces in {root} were not analysed ({exc!r})"]
    analysed = [c for c in (summary or {}).get("captures", []) if not c.get("error")]
    if analysed and push is not None:
        from .trace.run_push import push_captures
        try:
            lines += push_captures(root, summary, push)
        except Exception as exc:  # the results are on disk all the same
            lines.append(f"the traces' GPU time was not pushed to Pyroscope ({exc!r})")
    elif analysed and no_push:
        lines.append(f"the traces' GPU time was not pushed to Pyroscope: {no_push}")
    from .safe_text import visible   # paths, a server's reply, an exception's text: shown, not obeyed
    for line in lines:
        print(f"otel-gpu run: {visible(line)}", file=sys.stderr, flush=True)


def _wait(proc: subprocess.Popen, latch: children.SignalLatch, grace_s: float, tracker: children.Tracker,
          keep: list[int]) -> int:
    """The command's return code; SIGKILL for it and its processes `grace_s` after SIGTERM/SIGHUP."""
    import time

    killed, reaped_at = False, time.monotonic()
    while True:
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now - reaped_at >= 2.0:   # zombies of processes re-parented to us
            tracker.reap_orphans(keep)
            reaped_at = now
        if not killed and latch.first_at is not None and now - latch.first_at >= grace_s:
            n = children.kill_tree(proc.pid)
            killed = True
            print(f"otel-gpu run: the command did not exit within {grace_s:g} s of "
                  f"{signal.Signals(latch.grace_signal).name}; killed it (SIGKILL)"
                  + (f" with {_processes(n - 1)} it started" if n > 1 else ""), file=sys.stderr, flush=True)


def _stall_stacks(directory: Path) -> None:
    """The job stalled: every rank's Python stacks into `directory`, named in one line (we never stop the job)."""
    from .record.session import relative
    from .stacks import request_stacks
    files = request_stacks(directory)
    where = f"the Python stacks of {words.count(len(files), 'rank')} in {relative(directory)}" if files else \
        "no rank answered the request for its Python stacks"
    print(f"otel-gpu run: the job is stalled (it keeps running; Ctrl-C ends it): {where}", file=sys.stderr, flush=True)


def _processes(n: int) -> str:
    return words.count(n, "process")


def _end_leftovers(tracker: children.Tracker, agent: subprocess.Popen | None, grace_s: float) -> None:
    """End what the command left running (daemons included): SIGTERM, SIGKILL after `grace_s`."""
    keep = [agent.pid] if agent is not None else []
    leftovers = tracker.new(exclude=keep)
    if leftovers:
        killed = children.end(leftovers, grace_s)
        print(f"otel-gpu run: ended {_processes(len(leftovers))} the command left running"
              + (f" ({killed} needed SIGKILL)" if killed else ""), file=sys.stderr, flush=True)
    tracker.reap_orphans(keep)


def _record_by_default(env: Mapping[str, str], pyroscope: str | None) -> bool:
    from .record.session import wants_recording
    return wants_recording(env, pyroscope)


def _start_recording(args, command: list[str]):
    import time

    from .record.session import DEFAULT_ROOT, RecordedRun, default_job, run_dir

    job = args.job or default_job(os.environ, command)
    directory = Path(args.record) if args.record else run_dir(Path(DEFAULT_ROOT), job, time.time())
    return RecordedRun(directory, job, command, os.environ, args.pyroscope)


def _finish_recording(recorded, status: int, report: bool, traces=None) -> int:
    """Close the store; analyse the profiler captures (`traces()`); then write the report and print the
    summary (a failure there is one line).
    Returns the run's status: the command's, or 1 for a command that succeeded while the
    recording's disk filled up (one line saying so; no report then)."""
    from .record.session import RecordingDiskFull, relative

    try:
        recorded.finish(status)
    except RecordingDiskFull as exc:   # the command ran unaffected: a failure of its own wins
        print(f"otel-gpu run: {exc}", file=sys.stderr, flush=True)
        return status or 1
    for line in recorded.forward_notes():   # a server the data went on to failed: one line each, what and why
        print(f"otel-gpu run: {line}", file=sys.stderr, flush=True)
    if traces is not None:   # the captures analysed (the receivers' threads gone: its readers may fork), before the report
        traces()
    if not report:
        print(f"otel-gpu run: recorded {relative(recorded.directory)}", file=sys.stderr)
        return status
    try:
        from .report.build import write_report_for_run
        summary = write_report_for_run(recorded.directory)
    except Exception as exc:   # the recording is safe on disk; the report can be written again
        print(f"otel-gpu run: recorded {relative(recorded.directory)}; report failed ({exc}): "
              f"run `otel-gpu report {relative(recorded.directory)}`", file=sys.stderr)
        return status
    from .terminal import wrap_lines, wrap_width
    print(wrap_lines(summary, wrap_width(sys.stderr)), file=sys.stderr, flush=True)
    return status


def _own_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a process of ours beside the command: the command's, without our sitecustomize."""
    out = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    return out


def _start_agent(extra: list[str], env: Mapping[str, str], log: Path | None = None) -> subprocess.Popen | None:
    """The node agent beside the command; its messages go to `log` when given (a recorded run's agent.log)."""
    agent_env = _own_env(env)
    cmd = [sys.executable, "-c", "import sys; from otel_gpu.cli import main; sys.exit(main())",
           "agent", "--no-live", *extra]
    cmd.append(f"--parent-pid={os.getpid()}")   # the agent also stops when it sees us gone
    try:
        if log is None:
            return children.popen(cmd, env=agent_env, stdin=subprocess.DEVNULL)
        with open(log, "ab") as out:
            return children.popen(cmd, env=agent_env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
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
        proc.wait()
