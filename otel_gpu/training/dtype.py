"""The dtype a rank's model computes in, seen once inside its first training forward.

Autocast state is per thread and open only around the forward, so it is read there: a one-shot
forward pre-hook on the trained model (removed at its first call in training mode with gradients
on) reads the autocast dtype of the model's device type when autocast is on, else the dominant
floating dtype of the trained weights (by element count; `ds_numel` under ZeRO-3). FP32 with
TF32 matmuls allowed (`torch.backends.cuda.matmul.allow_tf32`, or a float32 matmul precision
below "highest") on a CUDA device is "tf32". FP8 (weights stored in a float8 dtype, torchao's
Float8 modules, Transformer Engine's fp8_autocast on) is "fp8", whose MFU is not judged.
Nothing here synchronises with a device; the hook costs one call, once.
"""
from __future__ import annotations

import sys

NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _name(dtype) -> str:
    text = str(dtype).replace("torch.", "")
    if text.startswith("float8"):
        return "fp8"
    return NAMES.get(text, text)


def _numel(p) -> int:
    return int(getattr(p, "ds_numel", 0) or p.numel())


def _device_type(params) -> str:
    for p in params:
        return p.device.type
    return "cpu"


def _te_fp8() -> bool:
    """Transformer Engine's fp8_autocast is on in this thread (only when the job imported it)."""
    fp8 = sys.modules.get("transformer_engine.pytorch.fp8")
    manager = getattr(fp8, "FP8GlobalStateManager", None)
    try:
        return bool(manager is not None and manager.is_fp8_enabled())
    except (AttributeError, RuntimeError, TypeError):   # another TE version's API: the weights' dtype decides
        return False


def _autocast(torch, device_type: str):
    """The autocast dtype for `device_type` when autocast is on in this thread, else None."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:   # torch < 2.4: the CUDA / CPU functions
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        if device_type == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
    return None


def _tf32(torch) -> bool:
    try:
        if torch.get_float32_matmul_precision() != "highest":
            return True
    except AttributeError:
        pass
    return bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False))


def compute_dtype(model) -> str:
    """fp32, tf32, bf16, fp16 or fp8 (another dtype's torch name) for `model`, called inside its forward."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad] or list(model.parameters())
    if any(type(m).__name__.startswith("Float8") for m in model.modules()) or _te_fp8():
        return "fp8"
    device_type = _device_type(params)
    auto = _autocast(torch, device_type)
    if auto is not None:
        return _name(auto)
    sizes: dict[str, int] = {}
    for p in params:
        if p.dtype.is_floating_point:
            sizes[_name(p.dtype)] = sizes.get(_name(p.dtype), 0) + _numel(p)
    if not sizes:
        return ""
    name = max(sizes, key=sizes.get)
    if name == "fp32" and device_type == "cuda" and _tf32(torch):
        return "tf32"
    return name


def watch(model, seen) -> None:
    """Call `seen(dtype)` once, from inside `model`'s first forward in training mode with gradients on."""
    import torch

    handle = None

    def pre(module, args):
        if not (module.training and torch.is_grad_enabled()):
            return None
        handle.remove()
        try:
            seen(compute_dtype(module))
        except Exception as exc:  # never let our bug reach the training loop
            from .session import log
            log.warning("otel-gpu: compute dtype not seen: %r", exc)
        return None

    handle = model.register_forward_pre_hook(pre)
