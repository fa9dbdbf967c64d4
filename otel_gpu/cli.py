"""`otel-gpu` subcommands. Each subcommand lives in its own module and registers here."""
from __future__ import annotations

import argparse
import sys

from . import __version__
from .errors import UsageError


def _subcommands():
    """(module, register-function) pairs; imported lazily so one broken extra never breaks the rest."""
    from .agent import cli as agent_cli
    yield agent_cli.register
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
    from .report import cli as report_cli
    yield report_cli.register


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-gpu", description="Observe, diagnose and improve distributed GPU training.")
    parser.add_argument("--version", action="version", version=f"otel-gpu {__version__}")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    for register in _subcommands():
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"otel-gpu {args.subcommand}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

