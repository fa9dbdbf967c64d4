"""Time per user annotation (HTA 0.5.0 ``get_gpu_user_annotation_breakdown``) and the kernels
that run inside each (``get_gpu_kernels_with_user_annotations``, counted per annotation).

``record_function("name")`` blocks appear in Kineto traces as ``user_annotation`` events on the
CPU and, since PyTorch 2.x, as ``gpu_user_annotation`` events spanning the GPU work they
launched. Per rank and annotation name: total, max, min, mean and standard deviation of the
durations (us); past ``num_kernels`` names (1000) or 80% of the cumulative time the tail is
folded into ``others``, as for kernels.
"""
from __future__ import annotations

import numpy as np

from .breakdown import aggregate_by_name, sort_desc
from .model import SYNC_EVENT_NAMES, RankView

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


def kernels_per_annotation(v: RankView) -> list[dict]:
    """GPU kernels and time (us) per GPU user annotation (HTA ``get_gpu_kernels_with_user_annotations``,
    counted per annotation): a kernel belongs to the innermost annotation on its stream that it
    overlaps (annotations are applied longest first, so the shortest wins); ``""`` for none. A
    0 us kernel overlaps nothing (pandas' rule for empty intervals).

    HTA matches the annotation's process and thread to the kernel's; a kernel's thread is its
    stream in Kineto traces and one rank drives one device, so the stream alone is matched here.
    """
    ev, rows = v.ev, v.rows
    ids = v.symbol_ids([GPU_ANNOTATION])
    if not len(ids):
        return []
    anno = rows[np.isin(ev.cat[rows], ids)]
    if not len(anno):
        return []
    sync_ids = v.symbol_ids(SYNC_EVENT_NAMES)
    kern = rows[((ev.stream[rows] >= 0) & (ev.correlation[rows] >= 0)) | np.isin(ev.name[rows], sync_ids)]
    k_ts = ev.ts[kern].astype(np.float64)
    k_end = k_ts + ev.dur[kern]
    k_stream = ev.stream[kern]
    label = np.full(len(kern), -1, dtype=np.int64)
    a_ts = ev.ts[anno].astype(np.float64)
    a_end = a_ts + ev.dur[anno]
    for j in sort_desc(ev.dur[anno]).tolist():  # longest first: the innermost annotation is applied last
        tid = ev.annotation_tid.get(int(ev.index[anno[j]]), -1)
        # [start, end) intervals; an empty one (0 us) overlaps nothing, as pandas decides
        overlap = (k_stream == tid) & (k_ts < a_end[j]) & (a_ts[j] < k_end) & (k_end > k_ts) & (a_end[j] > a_ts[j])
        label[overlap] = ev.name[anno[j]]
    out = []
    for name_id in np.unique(label).tolist():
        m = label == name_id
        out.append({"rank": v.rank, "annotation": v.names[name_id] if name_id >= 0 else "",
                    "kernels": int(m.sum()), "kernel_time_us": float(ev.dur[kern][m].sum())})
    out.sort(key=lambda r: r["annotation"])
    return out
