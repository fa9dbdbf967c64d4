"""The sample-efficiency replay (bench/tune_replay.py) runs the study's own queue and sampler on its
surface: deterministic, the baseline well above the optimum, the queue's first settings among the
trials, and a few seeds of the comparison run end to end."""
from __future__ import annotations

import sys

import pytest

from .helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
R = pytest.importorskip("tune_replay", reason="bench/tune_replay.py not importable")


def test_surface_is_deterministic_and_shaped_like_the_study():
    space, baseline = R.study_space()
    assert baseline["overlap_comm"] is False and baseline["reduce_bucket_size"] == 1024 * 1024
    assert R.step_time_ms(baseline) == R.step_time_ms(dict(baseline))
    optimum = R.optimum_ms(space, samples=3000)
    assert 1.3 < R.step_time_ms(baseline) / optimum < 1.7


def test_a_few_seeds_of_the_comparison():
    r = R.compare(seeds=2, tuner_trials=8, random_trials=10)
    assert r["tuner_ms"]["worst"] < r["baseline_ms"] and r["random_long_ms"]["worst"] < r["baseline_ms"]
    assert 0 <= r["tuner_at_least_as_good_share"] <= 1
