"""Space, "auto" resolution, trial config generation and validation, against LLaMA-Factory's ZeRO-3 configs."""
import json
from pathlib import Path

import optuna
import pytest

from otel_gpu.tune import config as C
from otel_gpu.tune.space import (DEEPSPEED_DEFAULTS, DEFAULT_PARAMS, Space, SpaceError, load_space,
                                 normalize, parse_space)

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed"
Z3 = DATA / "llamafactory_ds_z3_config.json"
Z3_FP8 = DATA / "llamafactory_ds_z3_fp8_config.json"
Z3_OFFLOAD = DATA / "llamafactory_ds_z3_offload_config.json"
DEFAULTS = json.loads((DATA / "zero3_defaults.json").read_text())


def test_hf_auto_rules_reproduce_llamafactory_fp8_resolved_values():
    """The fp8 config holds values HF resolved for hidden_size 3584: our rules give the same numbers."""
    resolved = C.resolve_auto(C.read_config(Z3), C.Facts(hidden_size=3584))
    fp8 = C.read_config(Z3_FP8)["zero_optimization"]
    for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        assert resolved["zero_optimization"][key] == fp8[key], key
    assert resolved["zero_optimization"]["stage3_prefetch_bucket_size"] == 11560550   # int(0.9*h*h), not rounded


def test_resolve_leaves_unknown_autos_and_never_touches_the_input():
    base = C.read_config(Z3)
    before = json.dumps(base, sort_keys=True)
    resolved = C.resolve_auto(base, C.Facts(hidden_size=64))
    assert json.dumps(base, sort_keys=True) == before
    assert set(C.auto_paths(resolved)) == {"train_batch_size", "train_micro_batch_size_per_gpu",
                                           "gradient_accumulation_steps", "gradient_clipping",
                                           "fp16.enabled", "bf16.enabled"}
    full = C.resolve_auto(base, C.Facts(hidden_size=64, micro_batch=4, grad_accum=2, world_size=2,
                                        max_grad_norm=1.0, precision="bf16"))
    assert C.auto_paths(full) == []
    assert (full["train_batch_size"], full["gradient_accumulation_steps"]) == (16, 2)
    assert full["bf16"]["enabled"] is True and full["fp16"]["enabled"] is False
    assert C.validate(full, world_size=2) == []


def test_offload_config_resolves_and_keeps_offload_sections():
    resolved = C.resolve_auto(C.read_config(Z3_OFFLOAD), C.Facts(hidden_size=4096))
    zero = resolved["zero_optimization"]
    assert zero["reduce_bucket_size"] == 4096 * 4096
    assert zero["stage3_param_persistence_threshold"] == 40960
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}


def test_stage2_gets_only_the_reduce_bucket():
    cfg = {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}}
    out = C.resolve_auto(cfg, C.Facts(hidden_size=10))
    assert out["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 100, "stage3_prefetch_bucket_size": "auto"}


def test_space_defaults_match_deepspeed_code_defaults():
    by_key = {d["json_key"]: d for d in DEFAULTS["zero_optimization_defaults"]}
    for name, value in DEEPSPEED_DEFAULTS.items():
        if name == "overlap_comm":
            assert by_key[name]["effective_default"].startswith("True if stage==3")
        else:
            assert by_key[name]["code_default"] == value, name
    assert [p.name for p in DEFAULT_PARAMS] == list(DEEPSPEED_DEFAULTS)
    sizes = [p for p in DEFAULT_PARAMS if p.kind == "int"]
    assert all(p.log and p.high / p.low >= 100 for p in sizes)


def test_baseline_values_from_resolved_llamafactory_config():
    resolved = C.resolve_auto(C.read_config(Z3), C.Facts(hidden_size=64))
    values = Space().values_in(resolved)
    assert values == {"overlap_comm": False, "contiguous_gradients": True, "sub_group_size": 10**9,
                      "reduce_bucket_size": 4096, "stage3_prefetch_bucket_size": 3686,
                      "stage3_param_persistence_threshold": 640, "stage3_max_live_parameters": 10**9,
                      "stage3_max_reuse_distance": 10**9}
    assert all(type(v) in (int, bool) for v in values.values())     # 1e9 in JSON -> int
    space = Space().widened_to(values)
    assert space.by_name("reduce_bucket_size").low == 4096                # baseline fits the range
    assert space.by_name("stage3_param_persistence_threshold").low == 640
    seeds = space.seeds(values)
    assert seeds[0] == {**values, "overlap_comm": True}
    assert {**values, **DEEPSPEED_DEFAULTS} in seeds
    assert values not in seeds and len(seeds) == len({json.dumps(s, sort_keys=True) for s in seeds})


def test_missing_knobs_take_deepspeed_effective_defaults():
    values = Space().values_in({"zero_optimization": {"stage": 3}})
    assert values["overlap_comm"] is True and values["stage3_prefetch_bucket_size"] == 5 * 10**7


def test_space_file_narrow_fix_drop_extend(tmp_path):
    f = tmp_path / "space.yaml"
    f.write_text("""
params:
  reduce_bucket_size: {low: 1e7, high: 1e9}
  sub_group_size: {fixed: 1e9}
  stage3_max_reuse_distance: false
  train_micro_batch_size_per_gpu: [1, 2, 4]
  zero_optimization.round_robin_gradients: {choices: [true, false]}
enqueue:
  - {overlap_comm: true, reduce_bucket_size: 5e8}
""")
    space = load_space(f)
    assert space.by_name("reduce_bucket_size").low == 10**7 and space.by_name("reduce_bucket_size").log
    assert space.by_name("sub_group_size") is None and space.fixed == {("zero_optimization", "sub_group_size"): 10**9}
    assert space.by_name("stage3_max_reuse_distance") is None
    assert space.by_name("train_micro_batch_size_per_gpu").choices == (1, 2, 4)
    assert space.by_name("zero_optimization.round_robin_gradients").path == ("zero_optimization", "round_robin_gradients")
    assert space.enqueue == ({"overlap_comm": True, "reduce_bucket_size": 5 * 10**8},)
    base = C.resolve_auto(C.read_config(Z3), C.Facts(hidden_size=64, micro_batch=4, grad_accum=1, world_size=2))
    values = space.values_in(base)
    assert space.seeds(values)[0]["reduce_bucket_size"] == 5 * 10**8          # the user's first


@pytest.mark.parametrize("doc, message", [
    ({"params": {"bogus_knob": {"low": 1, "high": 2}}}, "unknown parameter 'bogus_knob'"),
    ({"params": {"reduce_bucket_size": {"low": 10, "high": 1}}}, "low 10 > high 1"),
    ({"params": {"reduce_bucket_size": {"low": 0, "high": 10, "log": True}}}, "log scale needs low > 0"),
    ({"params": {"overlap_comm": {"low": 0, "high": 1}}}, "is a choice"),
    ({"params": {"sub_group_size": {"fixed": 1, "low": 2}}}, "cannot be combined"),
    ({"enqueue": [{"nothing": 1}]}, "not a tuned parameter"),
    ({"enqueue": [{"overlap_comm": 3}]}, "not one of its choices"),
    ({"other": 1}, "unknown section"),
    ({"params": {p.name: False for p in DEFAULT_PARAMS}}, "nothing left to tune"),
])
def test_space_errors_are_one_clear_line(doc, message):
    with pytest.raises(SpaceError, match=message) as err:
        parse_space(doc)
    assert "\n" not in str(err.value)


def test_bad_yaml_is_one_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("params: [unclosed\n")
    with pytest.raises(SpaceError, match="not valid YAML") as err:
        load_space(f)
    assert "\n" not in str(err.value)


def test_suggestions_stay_in_range_and_types():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    space = Space()
    for _ in range(30):
        values = space.suggest(study.ask())
        for p in DEFAULT_PARAMS:
            assert p.contains(values[p.name]), (p.name, values[p.name])
        cfg = C.trial_config({"zero_optimization": {"stage": 3}}, space, values)
        assert C.validate(cfg) == []
    assert normalize(1e9) == 10**9 and normalize(0.5) == 0.5 and normalize(True) is True


def test_trial_config_applies_fixed_but_not_to_baseline():
    space = parse_space({"params": {"sub_group_size": {"fixed": 10**8}}})
    base = {"zero_optimization": {"stage": 3, "sub_group_size": 10**9}}
    assert C.trial_config(base, space, {}, baseline=True)["zero_optimization"]["sub_group_size"] == 10**9
    assert C.trial_config(base, space, {})["zero_optimization"]["sub_group_size"] == 10**8
    assert base["zero_optimization"]["sub_group_size"] == 10**9


def test_micro_batch_keeps_global_batch_or_is_rejected():
    space = parse_space({"params": {"train_micro_batch_size_per_gpu": [2, 3, 4]}})
    base = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
            "zero_optimization": {"stage": 3}}
    ok = C.trial_config(base, space, {"train_micro_batch_size_per_gpu": 2}, world_size=2)
    assert (ok["train_micro_batch_size_per_gpu"], ok["gradient_accumulation_steps"]) == (2, 4)
    assert C.validate(ok, world_size=2) == []
    bad = C.trial_config(base, space, {"train_micro_batch_size_per_gpu": 3}, world_size=2)
    reasons = C.validate(bad, world_size=2)
    assert reasons == ["train_batch_size=16 cannot be split into micro batches of 3 on 2 ranks (16 is not a multiple of 3 x 2)"]


@pytest.mark.parametrize("patch, message", [
    ({"zero_optimization": {"stage": 3, "reduce_bucket_size": -1}}, "reduce_bucket_size=-1: DeepSpeed requires an integer >= 0"),
    ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 2.5}}, "integer >= 0"),
    ({"zero_optimization": {"stage": 3, "overlap_comm": "yes"}}, "overlap_comm='yes': DeepSpeed requires true or false"),
    ({"zero_optimization": {"stage": 5}}, "stage=5"),
    ({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 0}, "whole number >= 1"),
    ({"zero_optimization": {"stage": 3}, "fp16": {"enabled": True}, "bf16": {"enabled": True}}, "both enabled"),
    ({"zero_optimization": {"stage": 3}, "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 1}, "is not train_micro_batch_size_per_gpu=2 x gradient_accumulation_steps=1 x world size 2"),
    ({}, "zero_optimization is missing"),
])
def test_validate_names_each_rejection(patch, message):
    reasons = C.validate(patch, world_size=2)
    assert len(reasons) == 1 and message in reasons[0], reasons


def test_llamafactory_configs_are_valid_as_shipped():
    for path in (Z3, Z3_FP8, Z3_OFFLOAD):
        assert C.validate(C.read_config(path)) == [], path.name     # 1e9 floats are fine, "auto" left to HF


def test_deepspeed_model_rejects_unknown_key_and_negative():
    pytest.importorskip("deepspeed", reason="deepspeed not installed (otel-gpu[train])")
    assert C.deepspeed_errors(C.read_config(Z3_FP8)) == []
    errors = C.deepspeed_errors({"zero_optimization": {"stage": 3, "reduce_bucket_size": -5, "not_a_knob": 1}})
    assert any("reduce_bucket_size" in e for e in errors) and any("not_a_knob" in e for e in errors)


def test_hidden_size_from_model_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 3584}))
    assert C.hidden_size_from_model(tmp_path) == 3584
    (tmp_path / "config.json").write_text(json.dumps({"hidden_sizes": [64, 128, 320]}))
    assert C.hidden_size_from_model(tmp_path) == 320
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(C.ConfigError, match="no hidden_size"):
        C.hidden_size_from_model(tmp_path)


def test_read_config_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  'x': 1}")
    with pytest.raises(C.ConfigError, match="not valid JSON: .* line 2"):
        C.read_config(bad)
    with pytest.raises(C.ConfigError, match="cannot read"):
        C.read_config(tmp_path / "missing.json")


def test_write_json_exclusive_never_overwrites(tmp_path):
    p = C.write_json(tmp_path / "a.json", {"x": 1}, exclusive=True)
    with pytest.raises(FileExistsError):
        C.write_json(p, {"x": 2}, exclusive=True)
    assert json.loads(p.read_text()) == {"x": 1}
    assert [f.name for f in tmp_path.iterdir()] == ["a.json"]       # no temp files left


def test_extension_params_take_deepspeed_defaults_for_the_baseline():
    space = parse_space({"params": {"zero_optimization.zero_hpz_partition_size": {"choices": [1, 2, 4, 8]},
                                    "zero_optimization.zero_quantized_weights": {"choices": [False, True]}}})
    values = space.values_in({"zero_optimization": {"stage": 3}})
    assert values["zero_optimization.zero_hpz_partition_size"] == 1
    assert values["zero_optimization.zero_quantized_weights"] is False


def test_deepspeed_default_from_the_installed_model():
    pytest.importorskip("deepspeed", reason="deepspeed not installed (otel-gpu[train])")
    assert C.deepspeed_default("stage3_prefetch_bucket_size") == 5 * 10**7       # by alias
    assert C.deepspeed_default("zero_hpz_partition_size") == 1
    assert C.deepspeed_default("no_such_key") is None
