"""Time per user annotation (HTA 0.5.0 ``get_gpu_user_annotation_breakdown``).

``record_function("name")`` blocks appear in Kineto traces as ``user_annotation`` events on the
CPU and, since PyTorch 2.x, as ``gpu_user_annotation`` events spanning the GPU work they
launched. Per rank and annotation name: total, max, min, mean and standard deviation of the
durations (us); past ``num_kernels`` names (1000) or 80% of the cumulative time the tail is
folded into ``others``, as for kernels.
"""
from __future__ import annotations

import numpy as np

from .breakdown import aggregate_by_name
from .model import RankView

GPU_ANNOTATION, CPU_ANNOTATION = "gpu_user_annotation", "user_annotation"


def user_annotation_breakdown(views: list[RankView], use_gpu_annotation: bool = True, duration_ratio: float = 0.8,
                              num_kernels: int = 1000) -> list[dict]:
    """Rows (rank, name, sum, max, min, mean, std) sorted by rank then name; [] without annotations."""
    cat = GPU_ANNOTATION if use_gpu_annotation else CPU_ANNOTATION
    out: list[dict] = []
    for v in views:
        ids = v.symbol_ids([cat])
        if not len(ids):
            continue
        rows = v.rows[np.isin(v.ev.cat[v.rows], ids)]
        for row in aggregate_by_name(v.names, v.ev.name[rows], v.ev.dur[rows], num_kernels, duration_ratio):
            out.append({"rank": v.rank, **row})
    out.sort(key=lambda r: (r["rank"], r["name"]))
    return out
