"""Property tests: any space file, base config or model config either parses into something
usable or is refused with one line (SpaceError / ConfigError), never another exception."""
from __future__ import annotations

import json
import math

import optuna
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otel_gpu.tune import config as C
from otel_gpu.tune.space import KNOWN_PATHS, Space, SpaceError, load_space, parse_space

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["1e9", "auto", "nan", "inf", "-1e400", ".inf"]))
names = st.one_of(st.sampled_from(sorted(KNOWN_PATHS)), st.sampled_from(["zero_optimization.x", "a.b.c", "x"]),
                  st.text(max_size=10))
keys = st.sampled_from(["low", "high", "log", "choices", "type", "fixed", "other"])
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(keys, inner, max_size=4)), max_leaves=12)
param_specs = st.one_of(st.just(False), st.none(), values,
                        st.fixed_dictionaries({}, optional={"low": scalars, "high": scalars, "log": scalars,
                                                            "type": st.sampled_from(["int", "float", "str", 3])}),
                        st.fixed_dictionaries({"choices": st.lists(scalars, max_size=4)}))
space_docs = st.one_of(
    values,
    st.fixed_dictionaries({}, optional={
        "params": st.one_of(values, st.lists(scalars, max_size=2), st.dictionaries(names, param_specs, max_size=5)),
        "enqueue": st.one_of(values, st.lists(st.dictionaries(names, scalars, max_size=3), max_size=3)),
        "other": scalars}))


def _check_usable(space: Space) -> None:
    assert space.params
    for p in space.params:
        if p.kind == "choice":
            assert p.choices
        else:
            assert math.isfinite(p.low) and math.isfinite(p.high) and p.low <= p.high
            assert not p.log or p.low > 0
            p.suggest(optuna.trial.FixedTrial({p.name: p.low}))
    for entry in space.enqueue:
        for value in entry.values():
            assert not isinstance(value, float) or math.isfinite(value)


@FAST
@given(space_docs)
@example({"params": {"\n": False}})   # the name was repeated raw in the message's example path
def test_any_space_document_parses_to_a_usable_space_or_one_line(doc):
    try:
        space = parse_space(doc)
    except SpaceError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    _check_usable(space)


@FAST
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                 space_docs.map(lambda d: json.dumps(d).encode())))
def test_any_space_file_loads_or_is_refused_in_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("space") / "space.yaml"
    path.write_bytes(data)
    try:
        space = load_space(path)
    except SpaceError as exc:
        assert "\n" not in str(exc)
        return
    _check_usable(space)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(), st.text(max_size=8),
              st.just("auto")),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["zero_optimization", "stage", "reduce_bucket_size",
                                                             "train_batch_size", "train_micro_batch_size_per_gpu",
                                                             "gradient_accumulation_steps", "fp16", "bf16", "enabled",
                                                             "hidden_size", "hidden_sizes", "text_config", "x"]),
                                            inner, max_size=5)), max_leaves=15)


@FAST
@given(st.one_of(st.binary(max_size=120), json_values.map(lambda v: json.dumps(v).encode())))
def test_any_base_config_file_reads_as_an_object_or_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("cfg") / "ds.json"
    path.write_bytes(data)
    try:
        config = C.read_config(path)
    except C.ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(config, dict)


@FAST
@given(json_values, st.integers(1, 64) | st.none())
def test_validate_and_resolve_never_raise_on_any_json_object(doc, world):
    config = doc if isinstance(doc, dict) else {"zero_optimization": doc}
    reasons = C.validate(config, world)
    assert all(isinstance(r, str) for r in reasons)
    resolved = C.resolve_auto(config, C.Facts(hidden_size=64, micro_batch=2, grad_accum=2, world_size=world,
                                              precision="bf16"))
    assert isinstance(resolved, dict)


@FAST
@given(json_values)
def test_hidden_size_from_any_model_config_is_a_positive_int_or_one_line(tmp_path_factory, doc):
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text(json.dumps(doc))
    try:
        h = C.hidden_size_from_model(folder)
    except C.ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(h, int) and not isinstance(h, bool) and h >= 1


log_rows = st.fixed_dictionaries({"current_steps": st.one_of(st.integers(-5, 50), st.floats(), st.text(max_size=3),
                                                             st.none()),
                                  "elapsed_time": st.one_of(st.floats(), st.integers(-10, 10**6),
                                                            st.sampled_from(["0:00:01", "1 day, 0:00:01", "x", "99:99"]),
                                                            st.none())})


def _sane(stats) -> None:
    assert stats.step_time_s is None or (math.isfinite(stats.step_time_s) and stats.step_time_s > 0)
    assert stats.steady_steps >= 0 and stats.total_steps >= 0


@FAST
@given(st.lists(st.one_of(log_rows.map(json.dumps), st.text(max_size=20)), max_size=12), st.integers(0, 5))
def test_any_trainer_log_gives_a_finite_positive_step_time_or_none(lines, warmup):
    from otel_gpu.tune.objective import parse_trainer_log

    _sane(parse_trainer_log("\n".join(lines), warmup))


progress = st.builds(lambda i, n, clock, rate, unit: f"{i}/{n} [{clock}<00:10, {rate}{unit}]",
                     st.integers(0, 60), st.integers(0, 60), st.sampled_from(["00:01", "00:00", "1:00:00", "99:59"]),
                     st.sampled_from(["0", "0.0", "2.5", "1e-9", "9" * 400, "."]), st.sampled_from(["s/it", "it/s"]))


@FAST
@given(st.lists(st.one_of(progress, st.text(max_size=20)), max_size=15), st.integers(0, 5))
def test_any_progress_output_gives_a_finite_positive_step_time_or_none(lines, warmup):
    from otel_gpu.tune.objective import parse_progress

    _sane(parse_progress("\r".join(lines), warmup))


@FAST
@given(st.lists(st.tuples(st.sampled_from(["0", "1"]), st.sampled_from(["_count", "_sum"]),
                          st.lists(st.tuples(st.integers(0, 20).map(float),
                                             st.one_of(st.floats(-10, 1e6), st.just(float("nan")), st.just(math.inf))),
                                   max_size=6)), max_size=6),
       st.integers(0, 4))
def test_histogram_samples_give_a_finite_positive_step_time_or_none(raw, warmup):
    from otel_gpu.promql import Series
    from otel_gpu.tune.objective import steady_from_histogram

    series = [Series({"__name__": "otelgpu_train_step_duration_seconds" + kind, "otelgpu_rank": rank},
                     sorted(dict(points).items())) for rank, kind, points in raw]
    stats = steady_from_histogram(series, warmup)
    _sane(stats)
    assert all(m is None or (math.isfinite(m) and m > 0) for m in stats.per_rank.values())
