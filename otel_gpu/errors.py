"""Errors shared by every subcommand: each maps to one line on stderr and an exit status."""
from __future__ import annotations


class UsageError(Exception):
    """Bad flags or environment values: one line to stderr, exit 2."""


class ConfigError(ValueError):
    """A bad setting (an OTEL_* or OTELGPU_* variable, a flag value): one line, exit 2."""
