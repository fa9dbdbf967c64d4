"""Run every analysis over a trace set and collect one result document (plain dicts/lists)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import (annotations, aten_ops, breakdown, call_stack, counters, critical_path, idle, kernel_sequences, launch,
               stragglers)
from .findings import Thresholds, check_ranks, thresholds_dict
from .grouping import group_findings
from .model import TraceSet
from .steps import cross_rank_summary


@dataclass
class Options:
    """Analysis knobs; defaults are HTA 0.5.0's (times in us)."""

    num_kernels: int = 10
    duration_ratio: float = 0.8
    include_memory_kernels: bool = True
    consecutive_kernel_delay: float = 30
    runtime_cutoff: float = 50
    launch_delay_cutoff: float = 100
    max_queue_length: int = counters.CUDA_MAX_LAUNCH_QUEUE
    straggler_candidates: int = 2
    critical_path: bool = True
    critical_path_annotation: str = "ProfilerStep"
    critical_path_instance: int | None = None  # None: the second instance when there are two, else the first
    kernel_sequences: tuple[str, ...] = ()  # operator names (substrings); none: the analysis is not run
    min_pattern_len: int = 3
    thresholds: Thresholds = field(default_factory=Thresholds)


def _for_csv(pairs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the CSV needs of the launch pairs (their rows served the findings); durations as
    float32 where that is exact (whole microseconds always are): less memory on many ranks."""
    out = {"correlation": pairs["correlation"]}
    for c in ("cpu_duration", "gpu_duration", "launch_delay"):
        narrow = pairs[c].astype(np.float32)
        out[c] = narrow if np.array_equal(narrow, pairs[c]) else pairs[c]
    return out


def _kernel_sequences(views, opts: Options, notes: list[str]) -> list[dict]:
    """Frequent kernel sequences of every rank for each requested operator (one call graph per rank)."""
    rows: list[dict] = []
    for v in views:
        cs = call_stack.build(v)
        notes += [f"rank {v.rank}: {n}" for n in cs.notes]
        for op in opts.kernel_sequences:
            got, why = kernel_sequences.frequent_sequences(v, cs, op, opts.min_pattern_len)
            rows += got
            if why:
                notes.append(f"rank {v.rank}: no frequent kernel sequences under {op!r}: {why}")
    return rows


def analyze(ts: TraceSet, opts: Options | None = None) -> dict:
    """All analyses of ``ts``; launch pairs are kept under ``_launch_pairs`` (arrays, for CSV)."""
    opts = opts or Options()
    views = list(ts.ranks.values())
    notes = list(ts.notes)
    temporal = {v.rank: breakdown.temporal_breakdown(v) for v in views}
    types, kernels = breakdown.kernel_breakdown(views, opts.num_kernels, opts.duration_ratio,
                                                opts.include_memory_kernels)
    idle_rows: list[dict] = []
    idle_stats: list[dict] = []
    for v in views:
        b, s = idle.idle_time_breakdown(v, opts.consecutive_kernel_delay)
        idle_rows += b
        idle_stats += s
    overlap = [breakdown.comm_comp_overlap(v) for v in views]
    pairs = {v.rank: launch.launch_pairs(v) for v in views}
    launch_rows = [{"rank": r, **launch.launch_summary(p, opts.runtime_cutoff, opts.launch_delay_cutoff)}
                   for r, p in pairs.items()]
    if not any(p["correlation"].size for p in pairs.values()) and any(temporal.values()):
        notes.append("no cudaLaunchKernel/cudaMemcpyAsync/cudaMemsetAsync calls matched to GPU events: "
                     "launch statistics are empty (HTA does not pair hipLaunchKernel either)")
    if not any(temporal.values()):
        notes.append("no GPU kernels in any rank: temporal, kernel, idle, overlap and launch analyses "
                     "have nothing to measure (HTA 0.5.0 fails here); CPU-side steps and findings follow")
    queue = [r for v in views for r in counters.queue_length_summary(v)]
    blocked = [r for v in views for r in counters.blocked_on_full_queue(v, opts.max_queue_length)]
    membw = [r for v in views for r in counters.memory_bw_summary(v)]
    aten: list[dict] = []
    pooled: dict = {}  # the all-ranks table, accumulated rank by rank (per-launch rows are not kept)
    for v in views:
        instances = aten_ops.aten_op_instances(aten_ops.aten_op_launches(v))
        aten += [{"rank": v.rank, **row} for row in aten_ops.summarize_instances(instances)]
        aten_ops.group_instances(instances, pooled)
    aten_all = aten_ops.summarize_groups(pooled)
    paths = critical_path.critical_paths(views, opts.critical_path_annotation, opts.critical_path_instance) \
        if opts.critical_path else []
    potential = stragglers.potential_stragglers(views, opts.straggler_candidates) if len(views) > 1 else \
        {"ranks": [], "counts": {}, "error": "one rank"}
    cross = cross_rank_summary(views, [t for t in temporal.values() if t])
    checks = check_ranks(views, temporal, idle_rows, opts.thresholds)
    pairs = {r: _for_csv(p) for r, p in pairs.items()}
    findings = group_findings(checks, opts.thresholds)
    sequences = {}
    if opts.kernel_sequences:
        seq = _kernel_sequences(views, opts, notes)
        sequences = {"kernel_sequences_request": {"operators": list(opts.kernel_sequences),
                                                  "min_pattern_len": opts.min_pattern_len},
                     "kernel_sequences": seq, "kernel_sequences_all_ranks": kernel_sequences.pool_ranks(seq)}
    return {
        "trace_dir": ts.path,
        "ranks": [v.rank for v in views],
        "files": {str(v.rank): v.ev.path for v in views},
        "notes": notes,
        "last_step_excluded": ts.steps_filtered,
        "temporal_breakdown": [t for t in temporal.values() if t],
        "kernel_type_breakdown": types,
        "kernel_breakdown": kernels,
        "idle_time_breakdown": idle_rows,
        "idle_interval_stats": idle_stats,
        "comm_comp_overlap": overlap,
        "launch_stats": launch_rows,
        "queue_length_summary": queue,
        "queue_full_blocked": blocked,
        "memory_bw_summary": membw,
        "potential_stragglers": potential,
        "gpu_user_annotation_breakdown": annotations.user_annotation_breakdown(views),
        "kernels_per_annotation": [r for v in views for r in annotations.kernels_per_annotation(v)],
        "aten_op_kernels": aten,
        "aten_op_kernels_all_ranks": aten_all,
        "critical_path": paths,
        **sequences,
        "cross_rank": cross,
        "findings": findings,
        "checks": checks,
        "thresholds": thresholds_dict(opts.thresholds),
        "_launch_pairs": pairs,
        "_views": views,  # for the per-rank time-series CSVs, made when written
    }


def jsonable(doc: dict) -> dict:
    """The document without private keys, NaN as None (strict JSON)."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if not str(k).startswith("_")}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, (float, np.floating)):
            return None if np.isnan(x) or np.isinf(x) else float(x)
        if isinstance(x, np.integer):
            return int(x)
        return x
    return clean(doc)
