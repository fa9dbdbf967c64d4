"""An enqueued setting must lie in the space the file gives: outside a narrowed range, or not one of
the choices, the space file is refused in one line naming the value and the range (exit 2), and no
trial runs."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_gpu.tune.space import SpaceError, parse_space
from tests.childenv import clean_env
from tests.tune.helpers import copy_base

CLI = [sys.executable, "-m", "otel_gpu"]


@given(low=st.integers(1, 10**9), span=st.integers(0, 10**9), value=st.integers(0, 3 * 10**9))
def test_a_value_outside_a_narrowed_range_is_refused(low, span, value):
    high = low + span
    doc = {"params": {"reduce_bucket_size": {"low": low, "high": high}}, "enqueue": [{"reduce_bucket_size": value}]}
    if low <= value <= high:
        assert parse_space(doc).enqueue == ({"reduce_bucket_size": value},)
        return
    with pytest.raises(SpaceError) as err:
        parse_space(doc, where="space.yaml")
    assert str(err.value) == (f"space.yaml: enqueue: reduce_bucket_size={value!r} is outside its range "
                              f"{low:g} to {high:g} (widen the range under params or change the value)")


@given(choices=st.lists(st.integers(1, 64), min_size=1, max_size=5, unique=True), value=st.integers(1, 64))
def test_a_value_outside_the_choices_is_refused(choices, value):
    doc = {"params": {"train_micro_batch_size_per_gpu": choices}, "enqueue": [{"train_micro_batch_size_per_gpu": value}]}
    if value in choices:
        assert parse_space(doc).enqueue == ({"train_micro_batch_size_per_gpu": value},)
        return
    with pytest.raises(SpaceError, match=f"train_micro_batch_size_per_gpu={value} is not one of its choices"):
        parse_space(doc)


@given(value=st.one_of(st.floats(1.5e6, 9e8).filter(lambda v: not v.is_integer()),
                       st.sampled_from(["abc", "1e", True, None])))
def test_an_int_knob_takes_whole_numbers_only(value):
    with pytest.raises(SpaceError, match=r"enqueue: reduce_bucket_size=.* is not (a whole number|a number)"):
        parse_space({"enqueue": [{"reduce_bucket_size": value}]})


def test_outside_the_default_range_it_is_tried_as_given():
    """The built-in ranges are a guess; only a range the file gives binds its enqueue entries."""
    space = parse_space({"enqueue": [{"stage3_max_reuse_distance": 1234567}]})
    assert space.enqueue == ({"stage3_max_reuse_distance": 1234567},)


def test_tune_refuses_the_space_file_before_any_trial(tmp_path):
    base = copy_base(tmp_path)
    marker = tmp_path / "trial-ran"
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  reduce_bucket_size: {low: 1e7, high: 1e8}\n"
                     "enqueue:\n  - {reduce_bucket_size: 1e12}\n")
    command = f"{sys.executable} -c \"open({str(marker)!r}, 'w')\" {{config}}"
    proc = subprocess.run(CLI + ["tune", "--base-config", str(base), "--command", command, "--space", str(space),
                                 "--trials", "1", "--hidden-size", "64", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=180, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"otel-gpu tune: {space}: enqueue: reduce_bucket_size=1e12 is outside its range "
                                   f"1e+07 to 1e+08 (widen the range under params or change the value)")
    assert not marker.exists() and not (tmp_path / "out").exists()
