"""Model FLOPs of training, from the model's shape and the tokens trained on (no OpenTelemetry import).

Per non-padding token, a training step of a transformer does 6 FLOPs per weight that is trained
(2 forward, 2 for the gradient of the input, 2 for the gradient of the weight) and 4 per frozen
weight (forward and input gradient: LoRA's frozen base between trained layers). A weight whose input
needs no gradient (it comes before the first trained parameter, in module order) skips the input
gradient: 4 if trained, 2 if frozen (LoRA's frozen layers before the first adapter). Plus the
attention scores and values, 12 x layers x hidden x sequence length (forward 4, backward 8; 4 for a
layer whose first projection comes before any trained parameter; the whole square, no causal
halving, as `FlopCounterMode` counts it). Module order stands for execution order (true of HF
models; a frozen weight after the first trained one in order but fed from before it counts 4, not 2). Weights are the matrices of every module but embeddings (a lookup is no multiply; a tied
output head counts once, as the head's; biases and norms are elementwise work and left out).

N is what one rank computes on its own batch: under DeepSpeed ZeRO-3 each weight counts `ds_numel`,
under FSDP1 the unsharded sizes in its flat parameter's metadata (`use_orig_params` either way),
under FSDP2 the DTensor's global size (data-parallel sharding: every rank runs the whole model on
its batch). Under tensor parallelism a rank computes only its share: a DTensor counts its global
size divided by the sizes of the mesh dimensions it is sharded on for tensor parallelism (dims
named "tp"/"tensor"; on an unnamed mesh, any Shard outside FSDP2), a Megatron-style local weight
its local size; the attention term is divided by the tensor-parallel degree. So the per-rank
counters add up to the job's model FLOPs whatever the parallelism.

Layers and hidden size come from a Hugging Face config found on the model, else from its
`nn.MultiheadAttention` modules (a plain `nn.Transformer` loop). A model with neither is "not
checked" (a CNN's work per sample is not 6N per token); `OTELGPU_FLOPS=measure` measures one step
with `torch.utils.flop_counter.FlopCounterMode` instead (flops_measure.py).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

BASIS_ATTENTION = "6N+attention"   # 6N (4N frozen) per token + 12*L*d*T, padding excluded
BASIS_MEASURED = "measured"        # FlopCounterMode over one step, per sample, times the samples counted
NOT_CHECKED = "not_checked"

# what each basis value (the counter's otelgpu.flops.basis attribute) means, for the report and docs
BASIS_TEXT = {
    BASIS_ATTENTION: "formula: 6 FLOPs per trained and 4 per frozen matrix weight per non-padding token "
                     "(less 2 where the input needs no gradient) plus 12 x layers x hidden x sequence length; "
                     "no causal halving; padding excluded; every micro-batch fetched (gradient accumulation "
                     "included); this rank's tensor-parallel share",
    BASIS_MEASURED: "measured: FlopCounterMode over one training batch (forward, backward, optimizer), "
                    "per sample, times the samples of every micro-batch fetched; padding included (what the "
                    "model computed); counts the operators FlopCounterMode knows (matmuls, convolutions, attention)",
}


@dataclass(frozen=True)
class Shape:
    """What the formula needs, or why not: matrix weights trained and frozen (count, this rank's
    share), of which `upstream` have an input that needs no gradient; layers, hidden size, layers
    before any trained parameter (`forward_layers`: attention forward only) and the tensor-parallel
    degree that divides the attention term."""

    trained: int = 0
    frozen: int = 0
    layers: int = 0
    hidden: int = 0
    why_not: str = ""      # non-empty: the formula does not fit this model
    upstream: int = 0
    forward_layers: int = 0
    tp: int = 1


def _matrix(p) -> bool:
    """A weight with two or more dimensions (a ZeRO-3 parameter's own shape is its empty shard's)."""
    return len(getattr(p, "ds_shape", None) or p.shape) >= 2


def _tp_dims(p, fsdp2: bool) -> list[int]:
    """Mesh dimensions a DTensor parameter is sharded on for tensor parallelism."""
    mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
    if mesh is None or placements is None:
        return []
    dim_names = getattr(mesh, "mesh_dim_names", None)
    out = []
    for i, pl in enumerate(placements):
        if not pl.is_shard():
            continue
        if dim_names:
            if "tp" in dim_names[i].lower() or "tensor" in dim_names[i].lower():
                out.append(i)
        elif not fsdp2:
            out.append(i)
    return out


def _share(p, fsdp2: bool) -> tuple[int, int]:
    """(elements this rank computes with, tensor-parallel degree) of parameter `p`: the whole weight
    under ZeRO-3 and FSDP, this rank's share under tensor parallelism."""
    ds = getattr(p, "ds_numel", None)   # DeepSpeed ZeRO-3: the local tensor is empty
    if ds is not None:
        return int(ds), 1
    dims = _tp_dims(p, fsdp2)
    if not dims:
        return int(p.numel()), 1    # a DTensor's numel is its global size
    tp = math.prod(p.device_mesh.size(i) for i in dims)
    return int(p.numel()) // tp, tp


def _flat_params(model):
    """FSDP1 flat parameters of the model (registered, or held by FSDP with use_orig_params=True)."""
    seen, out = set(), []
    for m in model.modules():
        cands = [getattr(m, "_flat_param", None)] + [p for p in m.parameters(recurse=False)]
        for flat in cands:
            if flat is not None and id(flat) not in seen and getattr(flat, "_param_infos", None) is not None:
                seen.add(id(flat))
                out.append(flat)
    return out


def _entries(model):
    """Per module, in registration order: [(elements, is a matrix, trained, tp degree)] of its own
    weights, embeddings' left out; FSDP1 flat parameters are split back into the modules they hold."""
    from torch import nn

    by_module: dict[int, list] = {}
    skip: set[int] = set()
    for flat in _flat_params(model):
        skip.add(id(flat))
        originals = getattr(flat, "_params", None) or []
        skip.update(id(p) for p in originals)
        rows = {}
        for i, (info, n, shape) in enumerate(zip(flat._param_infos, flat._numels, flat._shapes)):
            trained = originals[i].requires_grad if i < len(originals) else flat.requires_grad
            rows[(id(info.module), info.param_name)] = (int(n), len(shape) >= 2, trained, 1)
            lookup = isinstance(info.module, nn.Embedding)
            by_module.setdefault(id(info.module), []).append((0 if lookup else int(n), len(shape) >= 2, trained, 1))
        for shared in getattr(flat, "_shared_param_infos", None) or ():   # a head tied to an embedding
            row = rows.get((id(shared.prim_module), shared.prim_param_name))
            if row is not None and isinstance(shared.prim_module, nn.Embedding) \
                    and not isinstance(shared.module, nn.Embedding):
                by_module.setdefault(id(shared.module), []).append(row)
    fsdp2 = set()
    fsdp = sys.modules.get("torch.distributed.fsdp")   # loaded where FSDP2 is used; never imported here
    fsdp_module = getattr(fsdp, "FSDPModule", None)
    if fsdp_module is not None:
        for m in model.modules():
            if isinstance(m, fsdp_module):
                fsdp2.update(id(p) for p in m.parameters())
    seen: set[int] = set()
    for m in model.modules():
        rows = list(by_module.get(id(m), []))
        for p in m.parameters(recurse=False):
            if id(p) in skip or id(p) in seen:
                continue
            if isinstance(m, nn.Embedding):   # not seen: a weight tied to a later head counts there
                rows.append((0, False, p.requires_grad, 1))
                continue
            seen.add(id(p))
            n, tp = _share(p, id(p) in fsdp2)
            rows.append((n, _matrix(p), p.requires_grad, tp))
        yield m, rows


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


def _layers_hidden_of(model) -> tuple[int, int]:
    """(layers, hidden) from an HF config, else from the model's nn.MultiheadAttention modules."""
    cfg = _config(model)
    if cfg is not None:
        return _layers_hidden(cfg)
    from torch import nn

    attention = [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    if attention and len({m.embed_dim for m in attention}) == 1:
        return len(attention), int(attention[0].embed_dim)
    return 0, 0


def _blocks(model, layers: int):
    """The repeated layers: the first ModuleList of `layers` modules (HF's `h` / `layers`)."""
    from torch import nn

    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) == layers:
            return list(m)
    return []


def _megatron_tp() -> int:
    """Megatron's tensor-parallel degree where Megatron is loaded and initialised, else 1."""
    ps = sys.modules.get("megatron.core.parallel_state")
    try:
        return int(ps.get_tensor_model_parallel_world_size()) if ps is not None else 1
    except (AssertionError, AttributeError, RuntimeError, TypeError):   # not initialised: none set up through it
        return 1


def model_shape(model) -> Shape:
    """The formula's inputs for `model` (a torch module, possibly wrapped); reads sizes only."""
    layers, hidden = _layers_hidden_of(model)
    if not layers or not hidden:
        return Shape(why_not="no transformer shape found (no config with layers and hidden size, "
                             "no nn.MultiheadAttention)")
    order = {id(m): i for i, m in enumerate(model.modules())}
    trained = frozen = upstream = 0
    tp, grad_from = 1, None      # grad_from: index of the first module with a trained parameter
    for m, rows in _entries(model):
        for n, matrix, is_trained, degree in rows:
            tp = max(tp, degree)
            if not matrix or not n:
                continue
            if is_trained:
                trained += n
            else:
                frozen += n
            if grad_from is None:
                upstream += n
        if grad_from is None and any(r[2] for r in rows):
            grad_from = order[id(m)]
    if any(getattr(p, "tensor_model_parallel", False) for p in model.parameters()):
        tp = max(tp, _megatron_tp())
    forward_layers = 0   # a layer whose attention inputs need no gradient: grad starts after its first projection
    for block in _blocks(model, layers):
        projections = [order[id(x)] for x in block.modules() if any(_matrix(p) for p in x.parameters(recurse=False))]
        if projections and (grad_from is None or grad_from > min(projections)):
            forward_layers += 1
    return Shape(trained, frozen, layers, hidden, upstream=upstream, forward_layers=forward_layers, tp=tp)


def per_token(shape: Shape) -> float:
    """FLOPs per non-padding token without the attention term."""
    return 6.0 * shape.trained + 4.0 * shape.frozen - 2.0 * shape.upstream


def attention_per_position(shape: Shape) -> float:
    """Attention FLOPs per (token x sequence position) on this rank: 12 x hidden a trained layer, 4 a
    layer run forward only, divided by the tensor-parallel degree (heads split across ranks)."""
    full = shape.layers - shape.forward_layers
    return (12.0 * full + 4.0 * shape.forward_layers) * shape.hidden / shape.tp


def model_flops(shape: Shape, tokens: float, token_positions: float) -> float:
    """Model FLOPs of `tokens` non-padding tokens whose sequence lengths sum, token by token, to
    `token_positions`; NaN where the formula does not fit."""
    if shape.why_not:
        return math.nan
    return per_token(shape) * tokens + attention_per_position(shape) * token_positions
