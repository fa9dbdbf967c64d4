"""Rule thresholds: documented defaults, overridable from a small TOML or YAML file.

The override file holds one table per rule (the keys below), e.g.::

    [checkpoint]
    share_warning = 0.03

    [sm_idle]
    ratio_max = 0.4

Unknown rules or keys and non-numbers are errors (a typo must not silently keep a default).
Shares and ratios are fractions 0..1, times in seconds, sizes in bytes.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from ..read_bounded import read_bytes

# rule -> key -> (default, meaning)
DEFAULTS: dict[str, dict[str, tuple[float, str]]] = {
    "severity": {
        "warning_share": (0.03, "a finding losing at least this share of GPU/rank time is a warning"),
        "critical_share": (0.15, "... and at least this share is critical"),
    },
    "sm_idle": {
        "util_min": (0.6, "mean NVML utilization above which a GPU counts as 'busy'"),
        "ratio_max": (0.5, "SM activity / utilization below this: SMs mostly idle behind a busy GPU"),
    },
    "throttle": {
        "share_min": (0.05, "a slowdown reason active at least this share of the window is reported"),
        "hw_slowdown_factor": (0.5, "clock factor assumed for HW slowdown when clocks are not in the data"),
        "temperature_c": (85.0, "GPU temperature (C) reported as a thermal risk"),
    },
    "gpu_idle": {
        "util_max": (0.05, "mean NVML utilization below this on a GPU holding a rank's memory while the rank "
                           "completes steps: the GPU sits idle (alerts)"),
    },
    "tensor": {
        "sm_min": (0.5, "mean GPM SM activity at or above this: SMs busy enough to judge the tensor pipes"),
        "info_max": (0.25, "tensor-pipe activity below this while SMs are busy: reported (info)"),
        "warning_max": (0.05, "... below this: warning (matmuls likely not on the tensor cores)"),
        "dram_busy": (0.5, "mean DRAM bandwidth share at or above this: memory-bound kernels named as likely"),
    },
    "memory": {
        "gpu_used_max": (0.95, "peak GPU memory used / size at or above this: memory pressure"),
        "swap_used_bytes": (1 << 30, "peak host swap in use at or above this (bytes)"),
        "swap_pages_per_s": (100.0, "mean pages swapped in+out per second at or above this"),
    },
    "allocator": {
        "retries_per_step_critical": (0.05, "CUDA allocator retries (cache flushed, cudaMalloc retried) per step at or "
                                            "above this on a rank: critical; any retry in the window: warning"),
        "fragmentation_warning": (0.3, "mean inactive-split bytes / mean reserved bytes at or above this on a device: "
                                       "fragmentation warning"),
        "reserved_min_bytes": (1 << 30, "fragmentation is judged only where the allocator reserves at least this "
                                        "much on average (bytes)"),
    },
    "checkpoint": {
        "share_warning": (0.03, "checkpoint share of wall time reported as a warning"),
        "share_critical": (0.10, "... and as critical"),
    },
    "input": {
        "share_warning": (0.05, "data-wait share of the ranks' wall time reported as a warning"),
        "share_critical": (0.20, "... and as critical"),
        "cpu_saturated": (0.85, "the job's processes' CPU (ranks and DataLoader workers) at or above this share of "
                                "a node's CPUs: the loader is starved of CPU"),
    },
    "unphased": {
        "share_min": (0.1, "step time outside every phase at or above this share on every rank is reported"),
        "share_warning": (0.2, "... as a warning"),
        "share_critical": (0.5, "... as critical"),
    },
    "straggler": {
        "lateness_share": (0.05, "a rank arriving this share of the step time late is a straggler"),
        "lateness_min_s": (0.002, "... and at least this late per step (seconds)"),
        "consistency": (0.6, "... and the busiest rank at least this share of the window's points in time"),
    },
    "periodic": {
        "drop_fraction": (0.5, "activity below this fraction of the window's median is a drop"),
        "min_events": (3, "at least this many drops to call them periodic"),
        "period_cv_max": (0.3, "coefficient of variation of the intervals below this: periodic"),
        "match_share": (0.6, "share of drops inside a phase to name that phase as the cause"),
    },
    "eval": {
        "share_min": (0.03, "eval share of wall time worth a look (info)"),
        "share_warning": (0.1, "... reported as a warning"),
        "share_critical": (0.3, "... and as critical"),
        "activity_drop": (0.3, "GPU activity during eval this much below training: a drop"),
    },
    "stall": {
        "step_factor": (10, "no step on any rank for this many times the job's median step ..."),
        "min_s": (120, "... and for at least this many seconds, while the ranks still export: the job is stalled"),
        "wait_share": (0.5, "a rank inside one host-timed collective for at least this share of the stall is "
                            "waiting; the ranks that are not hold the others up (gloo)"),
        "gone_s": (30, "a rank whose series stopped this long (at least 3 export intervals) before the newest "
                       "point of the others is gone (it holds the others up)"),
        "outside_share": (0.75, "every rank spent this share of the last minute (or of the stall, if shorter) in "
                                "checkpoint or eval: a save or an evaluation, not a stall"),
    },
    "comm": {
        "wait_share_warning": (0.2, "share of step time every rank is blocked in collectives (or, without that "
                                    "metric, of training-thread profile samples in communication): warning"),
        "wait_share_critical": (0.4, "... critical"),
        "link_busy": (0.6, "interconnect throughput / link limit above this: bandwidth-bound"),
        "cpu_contended": (0.9, "a node's CPUs at least this busy, with at least cpu_others of them other "
                               "processes': the collective wait may be ranks waiting for a CPU (info, low confidence)"),
        "cpu_others": (0.2, "... the share of the node's CPUs used by processes outside the job"),
    },
    "slowdown": {
        "share_warning": (0.25, "watching: a rank's busy time per step (or the job's step time) this share above "
                                "the median of its earlier windows, for a third of the window: warning"),
        "share_critical": (0.6, "... critical"),
        "min_steps": (5, "... judged on windows holding at least this many steps"),
    },
}


MAX_FILE_BYTES = 1 << 20   # a thresholds file: a few hundred bytes; more is not one


class ThresholdError(ValueError):
    """A bad override file; the message is one line."""


class Thresholds:
    """Read-only view: `t["checkpoint"]["share_warning"]` or `t.get("checkpoint", "share_warning")`."""

    def __init__(self, overrides: Mapping[str, Mapping[str, float]] | None = None):
        self._values = {rule: {k: v for k, (v, _) in keys.items()} for rule, keys in DEFAULTS.items()}
        for rule, keys in (overrides or {}).items():
            for key, value in keys.items():
                self._values[rule][key] = value

    def __getitem__(self, rule: str) -> dict[str, float]:
        return self._values[rule]

    def get(self, rule: str, key: str) -> float:
        return self._values[rule][key]

    def as_dict(self) -> dict[str, dict[str, float]]:
        return copy.deepcopy(self._values)


def validate(data: Any, origin: str = "thresholds") -> dict[str, dict[str, float]]:
    """Check an override mapping against DEFAULTS; ThresholdError (one line) on the first problem."""
    if not isinstance(data, Mapping):
        raise ThresholdError(f"{origin}: expected a table of rules, got {type(data).__name__}")
    out: dict[str, dict[str, float]] = {}
    for rule, keys in data.items():
        if rule not in DEFAULTS:
            raise ThresholdError(f"{origin}: unknown rule {rule!r} (known: {', '.join(DEFAULTS)})")
        if not isinstance(keys, Mapping):
            raise ThresholdError(f"{origin}: [{rule}] must be a table of key = number")
        for key, value in keys.items():
            if key not in DEFAULTS[rule]:
                raise ThresholdError(f"{origin}: unknown key {rule}.{key} (known: {', '.join(DEFAULTS[rule])})")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ThresholdError(f"{origin}: {rule}.{key} = {value!r} is not a number")
            if value < 0:
                raise ThresholdError(f"{origin}: {rule}.{key} = {value!r} must not be negative")
            out.setdefault(rule, {})[key] = float(value)
    return out


def parse_overrides(text: str, suffix: str, origin: str = "thresholds") -> dict[str, dict[str, float]]:
    """Parse override text as TOML (`.toml`) or YAML (`.yaml`/`.yml`) and validate it."""
    suffix = suffix.lower()
    if suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ImportError:
                raise ThresholdError(f"{origin}: reading TOML needs Python 3.11+ or the tomli package") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ThresholdError(f"{origin}: not valid TOML: {exc}") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ThresholdError(f"{origin}: reading YAML needs PyYAML (pip install pyyaml)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ThresholdError(f"{origin}: not valid YAML: {' '.join(str(exc).split())}") from None
        data = {} if data is None else data
    else:
        raise ThresholdError(f"{origin}: expected a .toml, .yaml or .yml file")
    return validate(data, origin)


def load_thresholds(path: str | Path | None) -> Thresholds:
    """Defaults, with the overrides of `path` (TOML or YAML by extension) when given."""
    if path is None:
        return Thresholds()
    p = Path(path)
    try:
        text = read_bytes(p, MAX_FILE_BYTES).decode("utf-8")
    except OSError as exc:
        raise ThresholdError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ThresholdError(f"{p}: not UTF-8 text") from None
    return Thresholds(parse_overrides(text, p.suffix, str(p)))


def describe_defaults() -> list[tuple[str, str, float, str]]:
    """(rule, key, default, meaning) rows, for docs and `--help`."""
    return [(rule, key, v, meaning) for rule, keys in DEFAULTS.items() for key, (v, meaning) in keys.items()]


def markdown_table() -> str:
    """The defaults as the Markdown table in docs/diagnose.md (a test keeps the two in step)."""
    rows = ["| rule | key | default | meaning |", "|---|---|---|---|"]
    for rule, key, v, meaning in describe_defaults():
        value = str(int(v)) if float(v).is_integer() and abs(v) >= 1 else f"{v:g}"
        rows.append(f"| `{rule}` | `{key}` | {value} | {meaning} |")
    return "\n".join(rows) + "\n"
