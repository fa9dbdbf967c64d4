"""Tags of event names, computed once per distinct name (names are shared across ranks), so that
rank-by-rank lookups cost a cached call per name instead of several regular expressions."""
from __future__ import annotations

import re
from functools import lru_cache

from .fold_case import FoldedPattern, folded

TAGS = {
    # framework scopes a sync may run in (see sync_calls)
    "framework": re.compile(r"DistributedDataParallel|FullyShardedDataParallel|FSDP|DeepSpeed|deepspeed|ZeRO|c10d::"
                            r"|^nccl:|^gloo:|ProcessGroup|record_param_comms|torch\.distributed|Reducer::"),
    "data_loader": re.compile(r"DataLoader|_DataLoaderIter"),
    "comm": FoldedPattern(r"^(gloo:|nccl:|c10d::|record_param_comms)|ProcessGroup\w*::wait"  # not aten::broadcast_tensors
                          r"|^(?!aten::).*(all_?reduce|all_?gather|reduce_?scatter|alltoall|all_to_all|broadcast)"),
    # what a run already does (see run_features)
    "fused_optimizer": FoldedPattern(r"_fused_adamw?_|_fused_sgd_|_fused_adagrad_|FusedAdam|fused_adam"
                                     r"|multi_tensor_adam|FusedLAMB|fused_lamb"),
    "foreach_optimizer": re.compile(r"^aten::_foreach_|multi_tensor_apply_kernel(?!.*Fused)"),
    "cuda_graphs": re.compile(r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)"),
    "torch_compile": re.compile(r"^triton_|Torch-Compiled Region|CompiledFunction|TorchDynamo"),
    "pinned_h2d": re.compile(r"^Memcpy HtoD \(Pinned"),
}


@lru_cache(maxsize=1 << 18)
def name_tags(name: str) -> frozenset:
    """The tags (keys of ``TAGS``) whose pattern the name matches (case-insensitively for the
    FoldedPattern ones)."""
    low = folded(name)
    return frozenset(t for t, rx in TAGS.items()
                     if (rx.search(name, low) if type(rx) is FoldedPattern else rx.search(name)))


def ids_tagged(names: list[str], tag: str) -> list[int]:
    """Ids (positions in ``names``) of the names carrying ``tag``."""
    return [i for i, n in enumerate(names) if tag in name_tags(n)]
