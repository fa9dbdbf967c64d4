"""Per-rank model FLOPs, tokens and compute dtype, per-GPU dense peaks, from a recording: what
`diagnose.work.work_parts` and `peak_part` compute with PromQL (counter increases over the window, the
dtype gauge's labels, each GPU's peak per dtype)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from .. import names as N
from .reader import Recording


def work_of(rec: Recording, start: float, end: float, rebase: bool = False) -> dict[tuple[str, str], dict[str, Any]]:
    """(host, rank) -> RankStats fields flops, flops_basis, tokens, compute_dtype over [start, end]."""
    flops: dict[tuple, dict[str, float]] = defaultdict(dict)
    for s, st in rec.summaries(N.TRAIN_FLOPS.name, start, end, rebase=rebase):
        per = flops[(s.get(N.HOST), s.get(N.RANK))]
        basis = s.get(N.FLOPS_BASIS) or ""
        per[basis] = per.get(basis, 0.0) + st.last
    tokens: dict[tuple, float] = defaultdict(float)
    for s, st in rec.summaries(N.TRAIN_TOKENS.name, start, end, rebase=rebase):
        tokens[(s.get(N.HOST), s.get(N.RANK))] += st.last
    dtypes: dict[tuple, set[str]] = defaultdict(set)
    for s, st in rec.summaries(N.TRAIN_COMPUTE_DTYPE.name, start, end):
        if s.get(N.DTYPE) and st.last:
            dtypes[(s.get(N.HOST), s.get(N.RANK))].add(s.get(N.DTYPE))
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key in set(flops) | set(tokens) | set(dtypes):
        f, d = flops.get(key), sorted(dtypes.get(key, ()))
        out[key] = dict(flops=sum(f.values()) if f else None, flops_basis="+".join(sorted(f)) if f else "",
                        tokens=tokens[key] if key in tokens else None, compute_dtype=d[0] if len(d) == 1 else "")
    return out


def peaks_of(rec: Recording, start: float, end: float) -> dict[tuple[str, str, str], dict[str, float]]:
    """(host, GPU UUID, index) -> dtype -> dense peak FLOP/s."""
    out: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for s, st in rec.summaries(N.GPU_PEAK_FLOPS.name, start, end):
        if s.get(N.DTYPE) and st.max and st.max > 0:
            out[(s.get(N.HOST), s.get(N.HW_ID), s.get(N.GPU_INDEX))][s.get(N.DTYPE)] = st.max
    return dict(out)
