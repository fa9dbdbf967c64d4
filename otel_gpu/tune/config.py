"""DeepSpeed configs: "auto" resolution (as the Hugging Face Trainer does it), trial generation, validation.

Pure functions over dicts, plus `read_config` / `write_json` at the edge. The base config is
only ever read; every generated config is a new file, written whole (temp file, then rename).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .. import errors, output
from ..read_bounded import read_bytes
from ..words import count
from .space import MICRO_BATCH, ZERO, Space, get_path, normalize

AUTO = "auto"
GRAD_ACCUM = "gradient_accumulation_steps"
TRAIN_BATCH = "train_batch_size"

# zero_optimization fields DeepSpeed declares as int >= 0 (pydantic Field(ge=0)).
ZERO_INTS = ("reduce_bucket_size", "allgather_bucket_size", "sub_group_size", "stage3_prefetch_bucket_size",
             "stage3_param_persistence_threshold", "stage3_model_persistence_threshold",
             "stage3_max_live_parameters", "stage3_max_reuse_distance")
ZERO_BOOLS = ("overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions",
              "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save", "elastic_checkpoint",
              "load_from_fp32_weights", "ignore_unused_parameters", "zero_hpz_partition_size_ignored")


class ConfigError(errors.ConfigError):
    """An unreadable or unusable base config (one line)."""


@dataclass(frozen=True)
class Facts:
    """What the Hugging Face Trainer knows when it fills in "auto" (None: not known, left as "auto")."""

    hidden_size: int | None = None       # model.config.hidden_size (else max(hidden_sizes))
    micro_batch: int | None = None       # per_device_train_batch_size
    grad_accum: int | None = None        # gradient_accumulation_steps
    world_size: int | None = None        # ranks in the job
    max_grad_norm: float | None = None   # gradient clipping
    precision: str | None = None         # "fp32" | "fp16" | "bf16"


MAX_CONFIG_BYTES = 4 << 20   # a DeepSpeed or model config file


def read_config_bytes(path: str | Path) -> bytes:
    """A config file's bytes, read once (it may be a pipe: `<(cat f)`), at most MAX_CONFIG_BYTES;
    ConfigError (one line) when it cannot be read, is larger, or a FIFO nobody writes to."""
    try:
        return read_bytes(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None


def parse_config(raw: bytes, path: str | Path) -> dict:
    """A config file's bytes as a JSON object; ConfigError (one line) otherwise."""
    try:
        config = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not read: values nested too deep") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return config


def read_config(path: str | Path) -> dict:
    return parse_config(read_config_bytes(path), path)


def hidden_size_from_model(model_dir: str | Path) -> int:
    """hidden_size from a Hugging Face model folder's config.json (or max(hidden_sizes), as HF does)."""
    path = Path(model_dir) / "config.json" if Path(model_dir).is_dir() else Path(model_dir)
    cfg = read_config(path)
    for holder in (cfg, cfg.get("text_config")):
        if not isinstance(holder, dict):
            continue
        size, sizes = holder.get("hidden_size"), holder.get("hidden_sizes")
        if _is_int(size) and size >= 1:
            return size
        if isinstance(sizes, list) and sizes and all(_is_int(v) and v >= 1 for v in sizes):
            return max(sizes)
    raise ConfigError(f"{path}: no hidden_size (a whole number >= 1) or hidden_sizes")


def set_path(config: dict, path: tuple[str, ...], value: Any) -> None:
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def auto_paths(config: Mapping, prefix: tuple[str, ...] = ()) -> list[str]:
    """Dotted paths of every value that is the string "auto"."""
    out = []
    for key, value in config.items():
        if isinstance(value, Mapping):
            out += auto_paths(value, prefix + (key,))
        elif value == AUTO:
            out.append(".".join(prefix + (key,)))
    return out


def resolve_auto(config: Mapping, facts: Facts) -> dict:
    """A copy of `config` with "auto" filled in where `facts` allow, by the Hugging Face Trainer's rules.

    ZeRO sizes from the hidden size h: reduce_bucket_size = h*h, and for stage 3
    stage3_prefetch_bucket_size = int(0.9*h*h), stage3_param_persistence_threshold = 10*h.
    Batch: micro batch, accumulation, train_batch_size = world * micro * accumulation;
    gradient_clipping = max_grad_norm; fp16/bf16 "enabled" from the precision.
    """
    out = copy.deepcopy(dict(config))

    def fill(path: tuple[str, ...], value: Any) -> None:
        if value is not None and get_path(out, path) == AUTO:
            set_path(out, path, value)

    h = facts.hidden_size
    zero = out.get(ZERO) if isinstance(out.get(ZERO), dict) else {}
    if h:
        fill((ZERO, "reduce_bucket_size"), h * h)
        if zero.get("stage") == 3:
            fill((ZERO, "stage3_prefetch_bucket_size"), int(0.9 * h * h))
            fill((ZERO, "stage3_param_persistence_threshold"), 10 * h)
    fill((MICRO_BATCH,), facts.micro_batch)
    fill((GRAD_ACCUM,), facts.grad_accum)
    if None not in (facts.world_size, facts.micro_batch, facts.grad_accum):
        fill((TRAIN_BATCH,), facts.world_size * facts.micro_batch * facts.grad_accum)
    fill(("gradient_clipping",), facts.max_grad_norm)
    if facts.precision:
        fill(("fp16", "enabled"), facts.precision == "fp16")
        fill(("bf16", "enabled"), facts.precision == "bf16")
    return out


# The Hugging Face Trainer's default max_grad_norm (TrainingArguments), which it writes into a
# "gradient_clipping": "auto"; DeepSpeed's own default (GRADIENT_CLIPPING_DEFAULT) is the same.
HF_MAX_GRAD_NORM = 1.0
# top-level values DeepSpeed reads as given: an "auto" left there fails in deepspeed.initialize
# (a str compared with a number) unless the Hugging Face Trainer fills it in first. DeepSpeed's own
# config models (zero_optimization, fp16, bf16) drop "auto" and take their defaults.
RAW_VALUES = (TRAIN_BATCH, MICRO_BATCH, GRAD_ACCUM, "gradient_clipping")


def with_defaults(config: Mapping, facts: Facts) -> tuple[Facts, list[str]]:
    """`facts` with the Hugging Face Trainer's default filled in where `config` has an "auto" that
    DeepSpeed cannot resolve by itself and no flag gave a value, and one line per assumption.

    Only gradient_clipping has a default that does not depend on the job (max_grad_norm 1.0); the
    batch values depend on the script and the world size and are never guessed (see `left_auto`)."""
    notes = []
    if facts.max_grad_norm is None and get_path(config, ("gradient_clipping",)) == AUTO:
        facts = dataclasses.replace(facts, max_grad_norm=HF_MAX_GRAD_NORM)
        notes.append(f'gradient_clipping "auto": assumed {HF_MAX_GRAD_NORM}, the Hugging Face Trainer\'s default '
                     "max_grad_norm (and DeepSpeed's own default); pass --max-grad-norm to use another value")
    return facts, notes


def left_auto(config: Mapping) -> list[str]:
    """One line naming the "auto" values left in a resolved config that only the Hugging Face Trainer
    fills in (a script calling deepspeed.initialize itself fails on them); empty when there are none."""
    left = [k for k in RAW_VALUES if config.get(k) == AUTO]
    if not left:
        return []
    return [f'{", ".join(left)} left "auto" for the Hugging Face Trainer to fill in at run time; a script that '
            "calls deepspeed.initialize itself fails on them (pass --micro-batch, --grad-accum and --world-size"
            + (", --max-grad-norm" if "gradient_clipping" in left else "") + ")"]


def trial_config(base: Mapping, space: Space, params: Mapping[str, Any], *, baseline: bool = False,
                 world_size: int | None = None) -> dict:
    """The config for one trial: `params` on top of the resolved base, plus the space's fixed values
    (not for the baseline, which is the user's starting point). Changing the micro batch keeps the
    global batch: gradient accumulation is recomputed from train_batch_size where both are set."""
    out = copy.deepcopy(dict(base))
    if not baseline:
        for path, value in space.fixed.items():
            set_path(out, path, value)
    for name, value in params.items():
        p = space.by_name(name)
        if p is not None:
            set_path(out, p.path, normalize(value))
    micro = out.get(MICRO_BATCH)
    if "train_micro_batch_size_per_gpu" in params and world_size and _is_int(micro) and micro > 0:
        total, accum = out.get(TRAIN_BATCH), out.get(GRAD_ACCUM)
        if _is_int(total):      # not divisible: left for validate() to reject with the reason
            if total % (micro * world_size) == 0:
                out[GRAD_ACCUM] = total // (micro * world_size)
        elif _is_int(accum) and TRAIN_BATCH in out:
            out[TRAIN_BATCH] = micro * accum * world_size
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_like(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())


def validate(config: Mapping, world_size: int | None = None) -> list[str]:
    """Reasons DeepSpeed would reject `config` (empty: acceptable). "auto" values are left to
    the Hugging Face Trainer and not judged here."""
    reasons = []
    zero = config.get(ZERO)
    if not isinstance(zero, Mapping):
        return [f"{ZERO} is missing or not an object"]
    for key in ZERO_INTS:
        value = zero.get(key)
        if value is None or value == AUTO:
            continue
        if not _int_like(value) or value < 0:
            reasons.append(f"{ZERO}.{key}={value!r}: DeepSpeed requires an integer >= 0")
    for key in ZERO_BOOLS:
        value = zero.get(key)
        if value is not None and value != AUTO and not isinstance(value, bool):
            reasons.append(f"{ZERO}.{key}={value!r}: DeepSpeed requires true or false")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        reasons.append(f"{ZERO}.stage={stage!r}: DeepSpeed accepts 0, 1, 2 or 3")
    batch = {k: config.get(k) for k in (TRAIN_BATCH, MICRO_BATCH, GRAD_ACCUM)}
    for key, value in batch.items():
        if value is None or value == AUTO:
            continue
        if not _int_like(value) or value < 1:
            reasons.append(f"{key}={value!r}: DeepSpeed requires a whole number >= 1")
    total, micro, accum = (batch[k] for k in (TRAIN_BATCH, MICRO_BATCH, GRAD_ACCUM))
    numeric = all(_int_like(v) and v >= 1 for v in (total, micro, accum))
    if world_size and _int_like(total) and _int_like(micro) and micro >= 1 and total % (micro * world_size):
        reasons.append(f"{TRAIN_BATCH}={total} cannot be split into micro batches of {micro} on {count(world_size, 'rank')} "
                       f"({total} is not a multiple of {micro} x {world_size})")
    elif world_size and numeric and total != micro * accum * world_size:
        reasons.append(f"{TRAIN_BATCH}={total} is not {MICRO_BATCH}={micro} x {GRAD_ACCUM}={accum} "
                       f"x world size {world_size} (DeepSpeed checks train_batch = micro x accumulation x ranks)")
    fp16, bf16 = (config.get(k, {}) for k in ("fp16", "bf16"))
    if isinstance(fp16, Mapping) and isinstance(bf16, Mapping) and fp16.get("enabled") is True and bf16.get("enabled") is True:
        reasons.append("fp16 and bf16 are both enabled: DeepSpeed allows one")
    return reasons


def deepspeed_errors(config: Mapping) -> list[str] | None:
    """The zero_optimization section checked by DeepSpeed's own config model (unknown keys, types).
    None when DeepSpeed is not importable here; "auto" values are skipped."""
    try:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
        from pydantic import ValidationError
    except Exception:   # not installed, or broken on this node: the pure rules still apply
        return None
    zero = {k: v for k, v in (config.get(ZERO) or {}).items() if v != AUTO}
    try:
        DeepSpeedZeroConfig(**zero)
    except ValidationError as exc:
        return [f"{ZERO}.{'.'.join(map(str, e['loc']))}={e.get('input')!r}: DeepSpeed: {e['msg']}" for e in exc.errors()]
    except Exception as exc:   # DeepSpeed's own asserts inside the model
        return [f"{ZERO}: DeepSpeed: {' '.join(str(exc).split())[:200]}"]
    return []


def deepspeed_default(key: str) -> Any:
    """The code default of zero_optimization.`key` in the installed DeepSpeed (None: unknown)."""
    try:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    except Exception:   # not installed here
        return None
    for name, f in DeepSpeedZeroConfig.model_fields.items():
        if key in (name, f.alias):
            value = f.default
            if isinstance(value, bool) or value is None:
                return value
            return int(value) if isinstance(value, int) else (value if isinstance(value, (float, str)) else None)
    return None


def dumps(config: Mapping) -> str:
    return json.dumps(config, indent=2) + "\n"


def write_json(path: str | Path, data: Any, *, exclusive: bool = False) -> Path:
    """Write JSON whole (`otel_gpu.output`: temp file + rename, mode and owner kept). `exclusive`:
    refuse (FileExistsError) to replace an existing file."""
    path = Path(path)
    if exclusive and os.path.lexists(path):
        raise FileExistsError(f"{path} exists; not overwriting")
    text = dumps(data) if isinstance(data, Mapping) else json.dumps(data, indent=2) + "\n"
    return output.write(path, text, exclusive=exclusive)
