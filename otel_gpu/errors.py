"""Errors shared by every subcommand: each maps to one line on stderr and an exit status.

The exit-status convention of every `otel-gpu` subcommand (see README, "Exit status"):
0 success, 1 a runtime failure (a server down, a disk full), 2 bad input (flags, environment,
input files), 130 interrupted (Ctrl-C / SIGTERM where a subcommand stops on it),
141 its output pipe was closed by the reader (`... | head`), quietly.
"""
from __future__ import annotations

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141


class UsageError(Exception):
    """Bad flags, environment values or input files: one line to stderr, exit 2."""


class ConfigError(ValueError):
    """A bad setting (an OTEL_* or OTELGPU_* variable, a flag value): one line, exit 2."""


class Failure(RuntimeError):
    """A runtime failure (a server unreachable, an output that cannot be written): one line, exit 1."""
