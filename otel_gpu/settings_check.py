"""Every OTELGPU_* setting checked once, before `otel-gpu run` starts anything.

A rank that meets a bad setting turns its telemetry off and the training goes on (telemetry must
never stop a training run), so a typo would otherwise cost a whole run's data with a log line per
rank. `otel-gpu run` calls `check_run_environment` on the environment its command will get: a bad
value is one line naming the variable and what it expects, exit 2, before the node agent or the
command starts; an OTELGPU_* name that no part of otel-gpu reads is a one-line warning (a typo
guard), not an error.

What is checked here: what the ranks read (the profiler's variables, `OTELGPU_TRAINING`,
`OTELGPU_JOB`, `OTELGPU_TRIAL`) and the OTEL_* exporter settings they use. The node agent's
variables are checked by its own configuration step, which `otel-gpu run` runs before starting it.
"""
from __future__ import annotations

import difflib
import sys
from typing import Callable, Mapping

from .export import otlp_settings
from .profiling import PROFILE_VARIABLES
from .safe_text import visible
from .trace.capture_files import parse_steps
from .values import choice, name_text, switch

PREFIX = "OTELGPU_"

# read by every rank (the training session, its profiler): name -> parser(raw, name)
RANK_VARIABLES: dict[str, Callable[[str, str], object]] = {
    "OTELGPU_TRAINING": switch,     # 0: no training telemetry at all
    "OTELGPU_JOB": name_text,       # the job name on every series and profile
    "OTELGPU_TRIAL": name_text,     # set by `otel-gpu tune` for each trial
    # model FLOPs: the formula, or one batch measured with FlopCounterMode (training/flops_measure.py's CHOICES)
    "OTELGPU_FLOPS": lambda raw, name: choice(raw, name, ("formula", "measure")),
    "OTELGPU_TRACE_STEPS": parse_steps,   # A-B: a profiler trace of steps A..B (`otel-gpu run --trace-steps`)
    "OTELGPU_TRACE_STACKS": switch,       # 0: captures without Python stacks (`otel-gpu run --trace-stacks`)
    **PROFILE_VARIABLES,
}

# read elsewhere, checked where they are read (free text or checked by their own command)
OTHER_VARIABLES = (
    # the node agent (`otel-gpu agent`; `otel-gpu run` checks them before starting it)
    "OTELGPU_INTERVAL", "OTELGPU_PROMETHEUS_PORT", "OTELGPU_PROMETHEUS_HOST", "OTELGPU_CHECKPOINT_DIR",
    "OTELGPU_PROCESSES", "OTELGPU_FAKE_GPUS", "OTELGPU_KUBELET_SOCKET",
    # the ranks: the recording's per-run key (`otel-gpu run` sets it; docs/record.md)
    "OTELGPU_RECORD_KEY",
    # the ranks: where to dump their stacks on request (`otel-gpu run --record` sets it; otel_gpu/stacks.py)
    "OTELGPU_STACKS_DIR",
    # the ranks: where traces go and capture requests are read (`otel-gpu run --record` sets it; capture_files.py)
    "OTELGPU_TRACE_DIR",
    # other subcommands
    "OTELGPU_DEBUG", "OTELGPU_GRAFANA_TOKEN", "OTELGPU_TRACE_JSON", "OTELGPU_TRACE_GZIP",
    # the compose stack (compose/.env)
    "OTELGPU_INGEST_ADDRESS", "OTELGPU_UI_ADDRESS",
    # the test suite's server binaries and download cache
    "OTELGPU_CACHE", "OTELGPU_PROMETHEUS", "OTELGPU_PROMETHEUS3", "OTELGPU_PROMTOOL3", "OTELGPU_VICTORIA_METRICS",
    "OTELGPU_NODE_EXPORTER",
)

KNOWN = frozenset(RANK_VARIABLES) | frozenset(OTHER_VARIABLES)


def unknown_settings(env: Mapping[str, str]) -> list[str]:
    """One warning line per OTELGPU_* name in `env` that otel-gpu does not read (pure)."""
    out = []
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in KNOWN:
            close = difflib.get_close_matches(name, sorted(KNOWN), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            out.append(f"{visible(name)} is not an otel-gpu setting and is ignored{hint}")   # a name from the environment
    return out


def check_rank_settings(env: Mapping[str, str]) -> None:
    """ConfigError (one line: the variable, its value, what is expected) on the first bad setting the
    ranks will read; an unset or empty variable means its default (pure)."""
    for name, parse in RANK_VARIABLES.items():
        if env.get(name, "").strip():
            parse(env[name], name)
    otlp_settings(env, default_interval_s=10.0)


def check_run_environment(env: Mapping[str, str], command: str = "otel-gpu run") -> None:
    """What `otel-gpu run` calls before it starts anything: warnings for unknown OTELGPU_* names on
    stderr, ConfigError (exit 2) for a bad value."""
    for line in unknown_settings(env):
        print(f"{command}: warning: {line}", file=sys.stderr)
    check_rank_settings(env)

