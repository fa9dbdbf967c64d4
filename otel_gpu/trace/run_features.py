"""What a run already does, read from the names in its trace, so that advice never suggests it again.

- ``fused_optimizer``: ``aten::_fused_adam(w)_`` / ``_fused_sgd_`` ops, FusedAdam / multi-tensor Adam kernels;
- ``foreach_optimizer``: ``aten::_foreach_*`` ops or ``multi_tensor_apply_kernel`` kernels (not fused ones);
- ``cuda_graphs``: ``cudaGraphLaunch`` calls;
- ``torch_compile``: Triton kernels (``triton_*``) or compiled regions;
- ``pinned_h2d``: host-to-device copies from pinned memory.
"""
from __future__ import annotations

from .model import RankView
from .name_tags import name_tags

FEATURES = ("fused_optimizer", "foreach_optimizer", "cuda_graphs", "torch_compile", "pinned_h2d")


def run_features(v: RankView) -> dict[str, str]:
    """feature -> one name from the trace that shows it (only the features present)."""
    out: dict[str, str] = {}
    for n in v.names:
        for feat in name_tags(n):
            if feat in FEATURES and feat not in out:
                out[feat] = n
    return out


def launch_bound_fix(features: dict[str, str]) -> str:
    """Advice for a launch-bound rank, leaving out what the run already does."""
    todo = []
    if "torch_compile" not in features:
        todo.append("fuse small ops with torch.compile")
    if "cuda_graphs" not in features:
        todo.append("capture the step in CUDA graphs (torch.compile(mode='reduce-overhead') or torch.cuda.graphs)")
    if not {"fused_optimizer", "foreach_optimizer"} & set(features):
        todo.append("use a fused optimizer (e.g. torch.optim.AdamW(fused=True) or foreach=True)")
    todo.append("raise the batch size (more work per launch)")
    done = [f"{feat.replace('_', ' ')} ({_short(name)})" for feat, name in features.items() if feat != "pinned_h2d"]
    text = "The GPU waits for the CPU to launch work: " + "; ".join(todo) + "."
    return text + (" Already in use: " + ", ".join(done) + "." if done else "")


def _short(name: str, n: int = 40) -> str:
    return name if len(name) <= n else name[: n - 3] + "..."
