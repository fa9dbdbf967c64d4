"""What the study tries, in order: the baseline, the known-good settings, the baseline again (to
measure noise), then Optuna's TPE sampler. Kept apart from the study so the benchmark
(bench/bench_tune.py) replays exactly what a real study does.
"""
from __future__ import annotations

from typing import Any, Mapping

import optuna

from . import config as C
from .space import Space

BASELINE, SEED, SAMPLED = "baseline", "seed", "sampled"
REPEAT = "repeat"            # user attribute of a baseline run after the first: 1, 2, ...
# TPE models from this many finished trials on; the enqueued ones (baseline, known-good settings,
# the baseline's repeat) count, so TPE takes over right after them
STARTUP_TRIALS = 5


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    """Independent TPE, constant liar so workers sharing a study spread out. Replayed over 50 seeds
    (bench/bench_tune.py --sampling, docs/performance.md), independent TPE found better settings in
    15 trials than multivariate TPE did (8 knobs, too few trials to model their joint density), with
    5 to 8 start-up trials alike."""
    return optuna.samplers.TPESampler(seed=seed, multivariate=False, constant_liar=True,
                                      n_startup_trials=STARTUP_TRIALS)


def baseline_values(space: Space, resolved_base: Mapping[str, Any]) -> dict[str, Any]:
    """The baseline's value of every tuned parameter: the resolved base config's, else DeepSpeed's
    default for a `zero_optimization` key it does not set (what runs when it is absent)."""
    values = space.values_in(resolved_base)
    for p in space.params:
        if p.name not in values and len(p.path) == 2 and p.path[0] == "zero_optimization":
            default = C.deepspeed_default(p.path[1])
            if default is not None:
                values[p.name] = default
    return values


def baseline_repeats(trials: int, seeds: int, runs: int) -> int:
    """Extra baseline runs that fit: only when at least two trials are left for the sampler after
    the baseline, the known-good settings and the repeats (pure)."""
    extra = max(0, runs - 1)
    while extra and trials < 1 + seeds + extra + 2:
        extra -= 1
    return extra


def queued_trials(space: Space, baseline: Mapping[str, Any], trials: int,
                  runs: int = 2) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(params, user attributes) to enqueue, in order: the baseline, the known-good settings, then
    the baseline's repeats (after the others, so they also see drift over time, not only
    back-to-back noise)."""
    seeds = space.seeds(baseline)
    out = [(dict(baseline), {"role": BASELINE})] + [(dict(s), {"role": SEED}) for s in seeds]
    out += [(dict(baseline), {"role": BASELINE, REPEAT: i + 1})
            for i in range(baseline_repeats(trials, len(seeds), runs))]
    return out
