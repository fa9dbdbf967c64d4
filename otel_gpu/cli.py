"""`otel-gpu` subcommands. Each subcommand lives in its own module and registers here.

Exit status, the same for every subcommand: 0 success, 1 runtime failure, 2 bad input
(flags, environment, input files), 130 interrupted, 141 stdout closed by its reader.
Every error is one line on stderr, never a traceback (OTELGPU_DEBUG=1 shows the traceback
of an unexpected error).
"""
from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .errors import EXIT_BROKEN_PIPE, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, ConfigError, Failure, UsageError
from .exiting import end_of_process
from .safe_text import visible


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `otel-gpu tune: argument --trials: ... (see --help)`, exit 2.

    Subparsers inherit the class, so every subcommand reports bad flags the same way."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _subcommands(first: str | None = None):
    """(module, register-function) pairs; imported lazily so one broken extra never breaks the rest."""
    from .agent import cli as agent_cli
    yield agent_cli.register
    if first in ("agent", "doctor"):
        return   # the agent runs for weeks: the other subcommands' imports would be ~14 MB of its RSS
    from .trace import cli as trace_cli
    yield trace_cli.register
    from . import run_cli
    yield run_cli.register
    from .tune import cli as tune_cli
    yield tune_cli.register
    from .diagnose import cli as diagnose_cli
    yield diagnose_cli.register
    from .dashboards import cli as dashboards_cli
    yield dashboards_cli.register
    from .alerts import cli as alerts_cli
    yield alerts_cli.register
    from .report import cli as report_cli
    yield report_cli.register


def build_parser(first: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser; only the agent's when `first` (the first argument) is agent or doctor."""
    parser = Parser(prog="otel-gpu", description="Observe, diagnose and improve distributed GPU training.")
    parser.add_argument("--version", action="version", version=f"otel-gpu {__version__}")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    for register in _subcommands(first):
        register(sub)
    return parser


def console() -> None:
    """The `otel-gpu` console script (and `python -m otel_gpu`): `main`, then the process ends."""
    sys.exit(main(ending=True))


def main(argv: list[str] | None = None, *, ending: bool = False) -> int:
    """Run one subcommand; its exit status. `ending`: the process ends right after (see exiting)."""
    _closed_std_fds()
    _tolerant_streams()
    args_given = sys.argv[1:] if argv is None else argv
    parser = build_parser(args_given[0] if args_given else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:   # --help, --version (0) or a bad flag (2, its line already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    name = f"otel-gpu {args.subcommand}"
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()   # a closed pipe shows here, not in the interpreter's exit
        if ending and args.subcommand == "trace":
            end_of_process()
        return status
    except (UsageError, ConfigError) as exc:
        return _fail(name, exc, EXIT_USAGE)
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (Failure, OSError) as exc:
        return _fail(name, exc, EXIT_FAILURE)
    except Exception as exc:   # a bug: still one line (the traceback on request)
        if os.environ.get("OTELGPU_DEBUG"):
            raise
        return _fail(name, f"internal error: {type(exc).__name__}: {exc} (OTELGPU_DEBUG=1 shows where)",
                     EXIT_FAILURE)


def _closed_std_fds() -> None:
    """A standard stream the shell closed (`>&-`) becomes /dev/null here, close-on-exec: our writes
    to it go nowhere instead of failing (sys.stdout is None then), no file we open later takes its
    descriptor (a recording's database once did), and the processes we start get it closed, as asked."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        if null != fd:
            os.dup2(null, fd, inheritable=False)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


def _tolerant_streams() -> None:
    """stdout and stderr write what their encoding cannot (an ASCII-only terminal, PYTHONIOENCODING=ascii,
    a lone surrogate) as backslash escapes rather than fail with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass   # not a text stream we can set (closed, None, a stand-in): left as it is


def _fail(name: str, exc, status: int) -> int:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError) and exc.strerror:
        text = f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    try:
        print(f"{name}: {visible(text)}", file=sys.stderr)   # an error can quote a name from data
    except OSError:
        pass   # stderr itself is gone: the status still says it
    return status


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush of a closed pipe stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass   # stdout has no descriptor (embedded): nothing will be flushed to it
