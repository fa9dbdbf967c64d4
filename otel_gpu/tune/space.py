"""The search space: which DeepSpeed ZeRO-3 settings a trial may change, and over what range.

Default: the eight ZeRO-3 knobs below, sizes on a log scale (they span orders of magnitude).
A small YAML (or JSON) file narrows, fixes, drops or extends it::

    params:
      reduce_bucket_size: {low: 1e7, high: 1e9}      # narrow (log scale kept)
      sub_group_size: {fixed: 1e9}                   # fix: every trial but the baseline uses it
      stage3_max_reuse_distance: false               # drop: keep the base config's value
      train_micro_batch_size_per_gpu: {choices: [1, 2, 4]}   # also tune the micro batch
      zero_optimization.round_robin_gradients: {choices: [true, false]}   # extend (dotted path)
    enqueue:                                          # settings to try right after the baseline
      - {overlap_comm: true, reduce_bucket_size: 5e8}

Pure: parsing and Optuna suggestions only; config files are in `config.py`.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from .. import errors
from ..read_bounded import read_text
from ..words import noun

ZERO = "zero_optimization"
MICRO_BATCH = "train_micro_batch_size_per_gpu"


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class SpaceError(errors.ConfigError):
    """A malformed space file or value (one line)."""


@dataclass(frozen=True)
class Param:
    """One tunable setting. `path` is where it lives in the DeepSpeed config."""

    name: str
    path: tuple[str, ...]
    kind: str                      # "int" | "float" | "choice"
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        """Ask an Optuna trial (or FixedTrial) for a value."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)

    def contains(self, value: Any) -> bool:
        if self.kind == "choice":
            return value in self.choices
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high

    def widened(self, value: Any) -> "Param":
        """This param with its range stretched to include `value` (so a baseline always fits)."""
        if self.contains(value) or self.kind == "choice" or not _is_number(value):
            return self
        low, high = min(self.low, value), max(self.high, value)
        if self.log and low <= 0:
            return self
        return replace(self, low=int(low) if self.kind == "int" else low, high=int(high) if self.kind == "int" else high)


def _size(name: str, low: float, high: float) -> Param:
    return Param(name, (ZERO, name), "int", int(low), int(high), log=True)


def _flag(name: str) -> Param:
    return Param(name, (ZERO, name), "choice", choices=(True, False))


# The eight ZeRO-3 knobs DeepSpeed's own autotuner leaves alone (bounds in elements or parameters).
DEFAULT_PARAMS: tuple[Param, ...] = (
    _flag("overlap_comm"),
    _flag("contiguous_gradients"),
    _size("sub_group_size", 1e7, 1e10),
    _size("reduce_bucket_size", 1e6, 1e9),
    _size("stage3_prefetch_bucket_size", 1e6, 1e9),
    _size("stage3_param_persistence_threshold", 1e3, 1e7),
    _size("stage3_max_live_parameters", 1e7, 1e10),
    _size("stage3_max_reuse_distance", 1e7, 1e10),
)
KNOWN_PATHS = {p.name: p.path for p in DEFAULT_PARAMS} | {MICRO_BATCH: (MICRO_BATCH,)}

# DeepSpeed's effective code defaults (deepspeed/runtime/zero/config.py), which its docs
# contradict for overlap_comm (stage 3), sub_group_size and stage3_prefetch_bucket_size.
DEEPSPEED_DEFAULTS = {
    "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 10**9,
    "reduce_bucket_size": 5 * 10**8, "stage3_prefetch_bucket_size": 5 * 10**7,
    "stage3_param_persistence_threshold": 10**5, "stage3_max_live_parameters": 10**9,
    "stage3_max_reuse_distance": 10**9,
}
# Code defaults of other zero_optimization keys a space may extend to (same file of DeepSpeed).
OTHER_ZERO_DEFAULTS = {
    "zero_hpz_partition_size": 1, "zero_quantized_weights": False, "zero_quantized_gradients": False,
    "round_robin_gradients": False, "reduce_scatter": True, "allgather_bucket_size": 5 * 10**8,
}
# Settings worth trying early (applied on top of the baseline, clipped into the space).
KNOWN_GOOD: tuple[dict, ...] = (
    {"overlap_comm": True},
    dict(DEEPSPEED_DEFAULTS),
    {"overlap_comm": True, "reduce_bucket_size": 5 * 10**8, "stage3_prefetch_bucket_size": 5 * 10**8,
     "stage3_param_persistence_threshold": 10**6},
)


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...] = DEFAULT_PARAMS
    fixed: Mapping[tuple[str, ...], Any] = field(default_factory=dict)   # path -> value
    enqueue: tuple[dict, ...] = ()                                       # user's settings to try first

    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def by_name(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def suggest(self, trial) -> dict[str, Any]:
        """Values for every param, from an Optuna trial (enqueued values come back as given)."""
        return {p.name: p.suggest(trial) for p in self.params}

    def values_in(self, config: Mapping) -> dict[str, Any]:
        """The current value of each param in `config` (DeepSpeed's default where absent)."""
        out = {}
        for p in self.params:
            value = get_path(config, p.path)
            if value is None and len(p.path) == 2 and p.path[0] == ZERO:
                value = {**OTHER_ZERO_DEFAULTS, **DEEPSPEED_DEFAULTS}.get(p.path[1])
            if value is not None:
                out[p.name] = normalize(value)
        return out

    def widened_to(self, values: Mapping[str, Any]) -> "Space":
        """Ranges stretched to include `values` (the baseline's)."""
        return replace(self, params=tuple(p.widened(values[p.name]) if p.name in values else p
                                          for p in self.params))

    def seeds(self, baseline: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Param sets to enqueue after the baseline: the user's, then known-good ones; in range, no duplicates."""
        out: list[dict[str, Any]] = [dict(baseline)]
        for extra in (*self.enqueue, *KNOWN_GOOD):
            cand = dict(baseline)
            for name, value in extra.items():
                p = self.by_name(name)
                if p is not None:
                    cand[name] = _clip(p, normalize(value))
            if cand not in out:
                out.append(cand)
        return out[1:]


def normalize(value: Any) -> Any:
    """Numbers such as 1e9 (a float in JSON, a string in YAML 1.1) as ints when integral."""
    if isinstance(value, str):
        if not _NUMBER.fullmatch(value.strip()):
            return value
        value = float(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _clip(p: Param, value: Any) -> Any:
    if p.kind == "choice" or not _is_number(value):
        return value
    value = min(max(value, p.low), p.high)
    return int(round(value)) if p.kind == "int" else value


def get_path(config: Mapping, path: tuple[str, ...]) -> Any:
    node: Any = config
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


# ---- the space file --------------------------------------------------------------------------

MAX_SPACE_BYTES = 1 << 20   # a space file


def load_space(path: str | Path) -> Space:
    """Read a space file (.yaml/.yml or .json); SpaceError names the problem."""
    path = Path(path)
    try:
        text = read_text(path, MAX_SPACE_BYTES)
    except OSError as exc:
        raise SpaceError(f"cannot read space file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpaceError(f"space file {path}: not UTF-8 text") from None
    try:
        if path.suffix == ".json":
            doc = json.loads(text)
        else:
            import yaml
            doc = yaml.safe_load(text)
    except RecursionError:
        raise SpaceError(f"space file {path}: not read: values nested too deep") from None
    except Exception as exc:  # yaml/json parse errors come in many classes
        raise SpaceError(f"space file {path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                         f"{' '.join(str(exc).split())[:200]}") from None
    return parse_space(doc or {}, where=str(path))


def parse_space(doc: Mapping, base: Space | None = None, where: str = "space") -> Space:
    """Apply a parsed space document to `base` (default: the eight ZeRO-3 knobs)."""
    base = base or Space()
    if not isinstance(doc, Mapping):
        raise SpaceError(f"{where}: expected a mapping with 'params' and/or 'enqueue'")
    unknown = set(doc) - {"params", "enqueue"}
    if unknown:
        raise SpaceError(f"{where}: unknown {noun(len(unknown), 'section')} "
                         f"{', '.join(sorted(map(str, unknown)))} (expected params, enqueue)")
    params = {p.name: p for p in base.params}
    fixed = dict(base.fixed)
    if not isinstance(doc.get("params") or {}, Mapping):
        raise SpaceError(f"{where}: 'params' must be a mapping name -> range, choices, fixed value or false")
    for name, spec in (doc.get("params") or {}).items():
        name = str(name)
        path = _path_of(name, where)
        if spec is False or spec is None:
            params.pop(name, None)
        elif isinstance(spec, Mapping) and "fixed" in spec:
            if len(spec) != 1:
                raise SpaceError(f"{where}: {name}: 'fixed' cannot be combined with other keys")
            params.pop(name, None)
            fixed[path] = _finite(normalize(spec["fixed"]), f"{where}: {name}: fixed")
        elif isinstance(spec, Mapping):
            params[name] = _param(name, path, spec, params.get(name), where)
        elif isinstance(spec, list):
            params[name] = _param(name, path, {"choices": spec}, params.get(name), where)
        else:
            raise SpaceError(f"{where}: {name}: expected a mapping (low/high/log, choices or fixed), a list, or false")
    enqueue = doc.get("enqueue") or []
    if not isinstance(enqueue, list) or not all(isinstance(e, Mapping) for e in enqueue):
        raise SpaceError(f"{where}: 'enqueue' must be a list of mappings name -> value")
    narrowed = {str(n) for n, spec in (doc.get("params") or {}).items() if isinstance(spec, (Mapping, list))}
    for entry in enqueue:
        for name, value in entry.items():
            _finite(normalize(value), f"{where}: enqueue: {name}")
            p = params.get(str(name))
            if p is None:
                raise SpaceError(f"{where}: enqueue: {name} is not a tuned parameter")
            _check_enqueued(p, normalize(value), value, str(name) in narrowed, f"{where}: enqueue")
    if not params:
        raise SpaceError(f"{where}: nothing left to tune")
    return Space(tuple(params.values()), fixed, tuple({str(k): normalize(v) for k, v in e.items()} for e in enqueue))


def _check_enqueued(p: Param, value: Any, raw: Any, narrowed: bool, where: str) -> None:
    """An enqueued value must be one the space allows: one of a choice's choices; for a range, a number
    (a whole one for an int), inside the range where the file gave one (outside the built-in default
    range it is tried as given: the range is widened to it)."""
    shown = raw if isinstance(raw, str) else repr(raw)
    if p.kind == "choice":
        if value not in p.choices:
            raise SpaceError(f"{where}: {p.name}={shown} is not one of its choices {list(p.choices)}")
        return
    if not _is_number(value):
        raise SpaceError(f"{where}: {p.name}={shown} is not a number")
    if p.kind == "int" and not float(value).is_integer():
        raise SpaceError(f"{where}: {p.name}={shown} is not a whole number")
    if narrowed and not p.contains(value):
        raise SpaceError(f"{where}: {p.name}={shown} is outside its range {p.low:g} to {p.high:g} "
                         f"(widen the range under params or change the value)")


def _finite(value: Any, what: str) -> Any:
    """`value`, unless it is a number that is not finite (nan, inf; or an int too large for a float)."""
    if _is_number(value):
        try:
            finite = math.isfinite(value)
        except OverflowError:
            finite = False
        if not finite:
            raise SpaceError(f"{what}={value!r}: must be a finite number")
    return value


def _path_of(name: str, where: str) -> tuple[str, ...]:
    if name in KNOWN_PATHS:
        return KNOWN_PATHS[name]
    if "." in name:
        return tuple(name.split("."))
    raise SpaceError(f"{where}: unknown parameter {name!r}: use one of {', '.join(KNOWN_PATHS)} "
                     "or a dotted config path such as zero_optimization.reduce_scatter")


def _param(name: str, path: tuple[str, ...], spec: Mapping, old: Param | None, where: str) -> Param:
    allowed = {"low", "high", "log", "choices", "type"}
    extra = set(spec) - allowed
    if extra:
        raise SpaceError(f"{where}: {name}: unknown {noun(len(extra), 'key')} {', '.join(sorted(map(str, extra)))}")
    if "choices" in spec:
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{where}: {name}: choices must be a non-empty list")
        return Param(name, path, "choice", choices=tuple(_finite(normalize(c), f"{where}: {name}: choices")
                                                         for c in choices))
    if old is not None and old.kind == "choice" and ("low" in spec or "high" in spec):
        raise SpaceError(f"{where}: {name}: is a choice; give 'choices', not low/high")
    low = normalize(spec.get("low", old.low if old else None))
    high = normalize(spec.get("high", old.high if old else None))
    if not (_is_number(low) and _is_number(high)):
        raise SpaceError(f"{where}: {name}: needs numeric low and high")
    _finite(low, f"{where}: {name}: low")
    _finite(high, f"{where}: {name}: high")
    if "log" in spec and not isinstance(spec["log"], bool):
        raise SpaceError(f"{where}: {name}: log must be true or false, not {spec['log']!r}")
    if low > high:
        raise SpaceError(f"{where}: {name}: low {low:g} > high {high:g}")
    log = bool(spec.get("log", old.log if old else high >= 100 * max(low, 1)))
    if log and low <= 0:
        raise SpaceError(f"{where}: {name}: a log scale needs low > 0")
    kind = spec.get("type") or (old.kind if old else ("int" if float(low).is_integer() and float(high).is_integer() else "float"))
    if kind not in ("int", "float"):
        raise SpaceError(f"{where}: {name}: type must be int or float")
    if kind == "int":
        if not (float(low).is_integer() and float(high).is_integer()):
            raise SpaceError(f"{where}: {name}: an int range needs whole-number bounds")
        low, high = int(low), int(high)
    return Param(name, path, kind, low, high, log)
