"""Tokens counted from the batches a DataLoader returns, and model FLOPs from the model's shape.

The truth comes from the jobs themselves: the mask sums a script computes, and
`torch.utils.flop_counter.FlopCounterMode` over the same steps.
"""
import json
import sys

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")

from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from conftest import HERE, REPO, otlp_env, query_until, unique_job  # noqa: E402
from otel_gpu import names  # noqa: E402
from otel_gpu.training import flops, forward, session, torch_hooks  # noqa: E402
from otel_gpu.training.tokens import batch_tokens  # noqa: E402

RUN = [sys.executable, "-c", "import sys; from otel_gpu.cli import main; sys.exit(main())", "run"]


def _mask(rows):
    """A right-padded 0/1 mask from each row's (kept, padded) lengths."""
    width = max(k + p for k, p in rows)
    m = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (k, _) in enumerate(rows):
        m[i, :k] = 1
    return m


rows_st = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 9)), min_size=1, max_size=6).filter(
    lambda rows: max(k + p for k, p in rows) > 0)


@given(rows_st, st.sampled_from(["dict", "tuple", "bool", "encoding"]))
@settings(max_examples=60, deadline=None)
def test_non_padding_tokens_are_the_mask_sum_whatever_the_batch_form(rows, form):
    mask = _mask(rows)
    ids = torch.randint(0, 100, mask.shape)
    batch = {"input_ids": ids, "attention_mask": mask.bool() if form == "bool" else mask, "labels": ids}
    if form == "tuple":
        batch = (batch, ids)
    if form == "encoding":
        from collections import UserDict
        batch = UserDict(batch)   # a tokenizer's BatchEncoding is a UserDict
    assert batch_tokens(batch) == (sum(k for k, _ in rows), mask.shape[1])


def test_ids_without_a_mask_count_their_shape_and_other_batches_hold_no_tokens():
    ids = torch.zeros(3, 7, dtype=torch.long)
    assert batch_tokens(ids) == (21, 7)
    assert batch_tokens((ids, torch.zeros(3, dtype=torch.long))) == (21, 7)
    assert batch_tokens({"input_ids": ids}) == (21, 7)
    images, labels = torch.randn(4, 3, 8, 8), torch.zeros(4, dtype=torch.long)
    assert batch_tokens((images, labels)) is None            # a CNN's batch
    assert batch_tokens(torch.zeros(4, dtype=torch.long)) is None   # labels alone: 1-D, not tokens
    assert batch_tokens({"pixel_values": images}) is None
    assert batch_tokens({"input_ids": ids, "attention_mask": torch.zeros(3, 1, 7, 7)}) is None   # additive 4-D mask


@pytest.fixture
def live():
    """A real session as this process's session, the torch hooks installed; removed after."""
    old = session._session
    s = session._session = session.Session({}, readers=[InMemoryMetricReader()], profile=False, host="h")
    torch_hooks.install()
    yield s
    forward.uninstall()
    torch_hooks.uninstall()
    s.shutdown(1.0)
    session._session = old


def test_fetching_counts_on_the_host_and_never_reads_a_device_tensor(live, monkeypatch):
    """Every synchronising call at the boundary is counted: none is made; a mask not on the CPU (here on
    the meta device, which has no values) is never read and its batch not counted."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("synchronize"))
    real_item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda self: calls.append("item") or real_item(self))
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: calls.append("cpu"))
    masks = [_mask([(5, 3), (8, 0)]), _mask([(1, 7), (2, 6)]), torch.ones(2, 8, dtype=torch.long, device="meta")]
    data = [{"input_ids": torch.zeros(2, 8, dtype=torch.long), "attention_mask": m} for m in masks]
    batches = iter(torch.utils.data.DataLoader(data, batch_size=None))
    calls.clear()   # the loader's own seeding at iter() reads a CPU tensor; the fetches must read none
    for _ in batches:
        pass
    assert calls == []
    assert live.sink.tokens_counted == 5 + 8 + 1 + 2
    assert live.sink.token_positions == 16 * 8


def test_evaluation_batches_are_not_training_tokens(live):
    data = [{"input_ids": torch.zeros(2, 4, dtype=torch.long)}] * 3
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    t = live.timer
    t.enter("eval")
    for _ in loader:
        pass
    t.exit("eval")
    assert live.sink.tokens_counted == 0
    for _ in loader:
        pass
    assert live.sink.tokens_counted == 3 * 8


def _gpt2(layers=4, frozen=False):
    transformers = pytest.importorskip("transformers", reason="transformers not installed (otel-gpu[train])")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=64,
                                                                 n_layer=layers, n_head=4, bos_token_id=0,
                                                                 eos_token_id=0))
    if frozen:   # LoRA-style: only the attention's input projections train
        for name, p in model.named_parameters():
            p.requires_grad_("attn.c_attn" in name)
    return model


def _measured(model, ids):
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("frozen", [False, True], ids=["trained-whole", "lora-style"])
def test_formula_is_within_3_percent_of_flop_counter_mode(frozen):
    model, ids = _gpt2(frozen=frozen), torch.randint(0, 256, (3, 32))
    shape = flops.model_shape(model)
    assert shape.layers == 4 and shape.hidden == 64 and (shape.frozen > 0) == frozen
    formula = flops.model_flops(shape, ids.numel(), ids.numel() * ids.shape[1])
    truth = _measured(model, ids)
    assert abs(formula / truth - 1) <= 0.03, (formula, truth)


def test_zero3_weights_count_their_whole_size_not_the_empty_shard():
    model = _gpt2(layers=2)
    whole = flops.model_shape(model)
    for p in model.parameters():   # what ZeRO-3 leaves on a rank: an empty tensor, the sizes as ds_* attributes
        p.ds_numel, p.ds_shape = p.numel(), tuple(p.shape)
        p.data = torch.empty(0)
    assert flops.model_shape(model) == whole


def test_a_cnn_is_not_checked_with_the_reason():
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(10))
    shape = flops.model_shape(cnn)
    assert shape.why_not.startswith("no transformer shape found")
    assert flops.model_flops(shape, 100, 100) != flops.model_flops(shape, 100, 100)   # NaN: not a number to show


@pytest.mark.slow
def test_untouched_gpt2_loops_tokens_exact_and_flops_within_3_percent(victoriametrics, tmp_path):
    """Two plain loops with no otel-gpu code under `otel-gpu run` (whole model trained, LoRA-style):
    the tokens counter equals the script's own mask sums; model FLOPs are within 3% of FlopCounterMode's
    count of the same steps with the padding positions' share left out."""
    pytest.importorskip("transformers", reason="transformers not installed (otel-gpu[train])")
    import subprocess

    vm, jobs, procs = victoriametrics, {}, []
    for variant in ("whole", "frozen"):
        job = unique_job("gpt2-" + variant)
        args = [str(HERE / "gpt2_padded_loop.py"), "6"] + (["--frozen"] if variant == "frozen" else [])
        procs.append((job, subprocess.Popen(RUN + ["--job", job, "--no-profile", "--", sys.executable, *args],
                                            env=otlp_env(vm, "ignored"), cwd=REPO, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)))
    for job, proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        jobs[job] = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    for job, truth in jobs.items():
        sel = f'otelgpu_job="{job}"'
        assert query_until(vm, f"otelgpu_train_tokens_total{{{sel}}}", 1)[0].value == truth["tokens"]
        (series,) = query_until(vm, f"otelgpu_train_flops_total{{{sel}}}", 1)
        assert series.labels["otelgpu_flops_basis"] == flops.BASIS_ATTENTION
        assert abs(series.value / truth["flops"] - 1) <= 0.03, (series.value, truth)
    assert names.TRAIN_FLOPS.name in {s.name for s in names.all_specs()}
