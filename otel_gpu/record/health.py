"""Per-rank GC and CUDA allocator inputs from a recording: what `diagnose.health.health_parts` computes
with PromQL (counter increases over the window, byte gauges' peaks and means per CUDA device)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from .. import names as N
from ..diagnose.health import ALLOC
from ..diagnose.model import AllocatorWindow
from .reader import Recording


def health_of(rec: Recording, start: float, end: float, rebase: bool = False) -> dict[tuple[str, str], dict[str, Any]]:
    """(host, rank) -> RankStats fields gc_s, gc_n, alloc over [start, end]."""
    out: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {"gc_s": {}, "gc_n": {}, "alloc": {}})
    for spec, field in ((N.TRAIN_GC_TIME, "gc_s"), (N.TRAIN_GC_COLLECTIONS, "gc_n")):
        for s, st in rec.summaries(spec.name, start, end, rebase=rebase):
            per = out[(s.get(N.HOST), s.get(N.RANK))][field]
            gen = s.get(N.GC_GENERATION)
            per[gen] = per.get(gen, 0.0) + st.last
    for field, spec, how in ALLOC.values():
        for s, st in rec.summaries(spec.name, start, end, rebase=rebase and how == "delta"):
            alloc = out[(s.get(N.HOST), s.get(N.RANK))]["alloc"]
            value = {"delta": st.last, "max": st.max, "avg": st.mean}[how]
            setattr(alloc.setdefault(s.get(N.CUDA_DEVICE), AllocatorWindow()), field, value)
    return dict(out)
