"""Model FLOPs of training, from the model's shape and the tokens trained on (no OpenTelemetry import).

Per non-padding token, a training step of a transformer does 6 FLOPs per weight that is trained
(2 forward, 2 for the gradient of the input, 2 for the gradient of the weight) and 4 per frozen
weight (forward and input gradient: LoRA's frozen base), plus the attention scores and values,
12 x layers x hidden x sequence length (forward 4, backward 8; the whole square, no causal
halving, as `FlopCounterMode` counts it). Weights are the matrices of every module but embeddings
(a lookup is no multiply; a tied output head counts once, as the head's; biases and norms are
elementwise work and left out); under DeepSpeed ZeRO-3
each counts `ds_numel`, under FSDP the unsharded size of its flat parameter, a DTensor its global
size. Layers and hidden size come from a Hugging Face config found on the model. Frozen weights
whose input needs no gradient either (LoRA's first projections after a frozen embedding) do 2,
not 4: the formula counts those high (+2.5% on a 4-layer GPT-2 with only its attention input
projections trained; nothing on a model trained whole).

A model with no such config is "not checked" (a CNN's work per sample is not 6N per token);
`OTELGPU_FLOPS_MEASURE=1` measures one step with `torch.utils.flop_counter.FlopCounterMode`
instead and counts that figure for every later step (basis "measured").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

BASIS_ATTENTION = "6N+attention"   # 6N (4N frozen) per token + 12*L*d*T, padding excluded
BASIS_MEASURED = "measured"        # FlopCounterMode over one step, times the steps counted
NOT_CHECKED = "not_checked"


@dataclass(frozen=True)
class Shape:
    """What the formula needs: weights trained and frozen (count), layers, hidden size; or why not."""

    trained: int = 0
    frozen: int = 0
    layers: int = 0
    hidden: int = 0
    why_not: str = ""      # non-empty: the formula does not fit this model


def _numel(p) -> int:
    """Elements of parameter `p` in the whole model, not this rank's shard."""
    ds = getattr(p, "ds_numel", None)   # DeepSpeed ZeRO-3: the local tensor is empty
    if ds is not None:
        return int(ds)
    return int(p.numel())               # a DTensor (FSDP2, tensor parallel) gives its global size


def _flat_counts(flat, embedding) -> tuple[int, int] | None:
    """(matrix weights, of which embeddings) of an FSDP flat parameter, from its unsharded metadata."""
    infos, numels = getattr(flat, "_param_infos", None), getattr(flat, "_numels", None)
    shapes = getattr(flat, "_shapes", None)
    if infos is None or numels is None or shapes is None:
        return None
    rows = [(info, int(n)) for info, n, shape in zip(infos, numels, shapes) if len(shape) >= 2]
    return sum(n for _, n in rows), sum(n for info, n in rows if isinstance(info.module, embedding))


def _config(model):
    """The first Hugging Face-style config on the model or a module in it (a wrapper's `.module`)."""
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and _layers_hidden(cfg) != (0, 0):
            return cfg
    return None


def _layers_hidden(cfg) -> tuple[int, int]:
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None) or 0
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None) or 0
    try:
        return int(layers), int(hidden)
    except (TypeError, ValueError):
        return 0, 0


def model_shape(model) -> Shape:
    """The formula's inputs for `model` (a torch module, possibly wrapped); reads sizes only."""
    from torch import nn

    cfg = _config(model)
    if cfg is None:
        return Shape(why_not="no transformer shape found (no config with layers and hidden size)")
    layers, hidden = _layers_hidden(cfg)
    seen: set[int] = set()
    trained = frozen = 0
    for m in model.modules():
        for p in m.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            flat = _flat_counts(p, nn.Embedding)
            if flat is not None:
                n = flat[0] - flat[1]
            elif isinstance(m, nn.Embedding):
                seen.discard(id(p))   # a weight tied to a later head counts there
                continue
            elif len(getattr(p, "ds_shape", None) or p.shape) < 2:
                continue      # a bias or a norm's scale: elementwise work, not a multiply per weight
            else:
                n = _numel(p)
            if p.requires_grad:
                trained += n
            else:
                frozen += n
    return Shape(trained, frozen, layers, hidden)


def per_token(shape: Shape) -> float:
    """FLOPs per non-padding token without the attention term."""
    return 6.0 * shape.trained + 4.0 * shape.frozen


def model_flops(shape: Shape, tokens: float, token_positions: float) -> float:
    """Model FLOPs of `tokens` non-padding tokens whose sequence lengths sum, token by token, to
    `token_positions`; NaN where the formula does not fit."""
    if shape.why_not:
        return math.nan
    return per_token(shape) * tokens + 12.0 * shape.layers * shape.hidden * token_positions
