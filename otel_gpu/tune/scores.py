"""What a trial is scored by: `--objective step_time|tokens_per_s|tflops_per_gpu|joules_per_token`, one or
several (comma-separated: an Optuna multi-objective study, whose best trials are its Pareto front).

Values come from the trial's record: step time from its scoring, the others from its evidence over the
same steady window (evidence.py). A trial that lacks an objective's input (no tokens counted, no energy
read, no GPU) is not scored 0: it fails with the reason the evidence gives ("not checked: ...").
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

# name -> (Optuna direction, unit shown, evidence key or None for the scored step time)
OBJECTIVES = {
    "step_time": ("minimize", "s/step", None),
    "tokens_per_s": ("maximize", "tokens/s", "tokens_per_s"),
    "tflops_per_gpu": ("maximize", "TFLOP/s per GPU", "tflops_per_gpu"),
    "joules_per_token": ("minimize", "J/token", "joules_per_token"),
}
DEFAULT = ("step_time",)
ATTR = "objectives"     # the study's user attribute naming its objectives


def parse(text: str) -> tuple[str, ...]:
    """'step_time,joules_per_token' -> ('step_time', 'joules_per_token'); ValueError with one line."""
    names = [p.strip() for p in str(text).split(",")]
    if not names or any(not n for n in names):
        raise ValueError(f"an empty objective name in {text!r} (choose from {', '.join(OBJECTIVES)})")
    for n in names:
        if n not in OBJECTIVES:
            raise ValueError(f"unknown objective {n[:40]!r} (choose from {', '.join(OBJECTIVES)})")
    if len(set(names)) != len(names):
        raise ValueError(f"an objective named twice in {text!r}")
    return tuple(names)


def directions(objectives: Sequence[str]) -> list[str]:
    return [OBJECTIVES[o][0] for o in objectives]


def value_of(objective: str, step_time_s: float | None, evidence: Mapping[str, Any]) -> tuple[float | None, str]:
    """(the value, '') or (None, why) for one objective of one trial."""
    key = OBJECTIVES[objective][2]
    if key is None:
        return (step_time_s, "") if step_time_s is not None else (None, "not checked: no step time")
    value = evidence.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value), ""
    why = str((evidence.get("not_checked") or {}).get(key) or "not checked: no evidence over a steady window")
    return None, why


def values_of(objectives: Sequence[str], step_time_s: float | None,
              evidence: Mapping[str, Any]) -> tuple[list[float] | None, str]:
    """(one value per objective, '') or (None, '<objective>: why') for the first one missing."""
    out = []
    for o in objectives:
        value, why = value_of(o, step_time_s, evidence)
        if value is None:
            return None, f"{o}: {why}"
        out.append(value)
    return out, ""


def of_study(study: optuna.Study) -> tuple[str, ...]:
    """The objectives a study was started with (older studies: step time)."""
    names = study.user_attrs.get(ATTR)
    return tuple(names) if isinstance(names, list) and all(n in OBJECTIVES for n in names) else DEFAULT


def front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The best trials: the Pareto front of a multi-objective study, the best one of a single-objective
    study (none before a trial completed)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not done:
        return []
    if len(study.directions) > 1:
        return sorted(study.best_trials, key=lambda t: t.number)
    return [study.best_trial]


def shown(objective: str, value: float) -> str:
    """'0.0213 J/token', '1.2e+04 tokens/s' (4 significant digits)."""
    return f"{value:.4g} {OBJECTIVES[objective][1]}"


def check_study(study: optuna.Study, objectives: Sequence[str], name: str) -> None:
    """Name the objectives in a new study; a resumed one must have been started with the same ones."""
    from .storage import TuneError
    if ATTR not in study.user_attrs and not study.trials:
        study.set_user_attr(ATTR, list(objectives))
        return
    if of_study(study) != tuple(objectives):
        raise TuneError(f"study {name!r} was started with --objective {','.join(of_study(study))}; pass the same "
                        "one to resume, or a new --study")
