"""The compute dtype seen inside a model's first training forward (training/dtype.py), on CPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")

from otel_gpu.training import dtype  # noqa: E402


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _seen(model, x, ctx=None):
    got = []
    dtype.watch(model, got.append)
    with torch.no_grad():
        model.eval()
        model(x)                    # evaluation: not the training forward
        model.train()
    assert got == []
    if ctx is None:
        model(x)
    else:
        with ctx:
            model(x)
    model(x)                        # the hook is gone after its one call
    return got


def test_fp32_weights_compute_in_fp32():
    assert _seen(_mlp(), torch.randn(2, 8)) == ["fp32"]


def test_autocast_inside_the_forward_wins_over_the_weights():
    got = _seen(_mlp(), torch.randn(2, 8), torch.autocast("cpu", dtype=torch.bfloat16))
    assert got == ["bf16"]


def test_bf16_and_fp16_weights():
    assert _seen(_mlp().to(torch.bfloat16), torch.randn(2, 8, dtype=torch.bfloat16)) == ["bf16"]
    m = _mlp().half()
    assert dtype.compute_dtype(m) == "fp16"


def test_the_dominant_trained_dtype_by_elements():
    m = _mlp()
    m[2].to(torch.bfloat16)              # 68 of 212 elements in bf16
    assert dtype.compute_dtype(m) == "fp32"
    m[0].requires_grad_(False)           # frozen weights do not vote while some are trained
    assert dtype.compute_dtype(m) == "bf16"


def test_fp8_weights_or_float8_modules():
    m = _mlp()
    m[0].weight.data = m[0].weight.data.to(torch.float8_e4m3fn)
    assert dtype.compute_dtype(m) == "fp8"

    class Float8Linear(torch.nn.Linear):   # torchao's training modules are named so
        pass

    assert dtype.compute_dtype(torch.nn.Sequential(Float8Linear(4, 4))) == "fp8"
