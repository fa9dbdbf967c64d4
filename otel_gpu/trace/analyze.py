"""Run every analysis over a trace set and collect one result document (plain dicts/lists)."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from functools import partial
from itertools import chain

import numpy as np

from . import (annotations, aten_ops, breakdown, call_stack, counters, critical_path, idle, kernel_sequences, launch,
               rank_csv, stragglers)
from .findings import Thresholds, check_rank, finish_checks, thresholds_dict
from .csv_text import columns, json_value, rows_text
from .grouping import group_findings
from .model import TraceSet
from .rank_pool import fork_map
from .steps import cross_rank_summary, rank_steps


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
    # rank -> median step time (us) of the same job unprofiled; None: not measured (launch-bound
    # verdicts then say the profiler's share was not checked)
    unprofiled_step_us: dict[int, float] | None = None


SHARED_STR_MAX = 4096  # longer strings are left as they are (each is hashed to be shared)
_ZERO = 0.0
PARALLEL_MIN_ROWS = 20_000  # events (all ranks) below which one process computes everything


def _for_csv(pairs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the CSV needs of the launch pairs (their rows served the findings); durations as
    float32 where that is exact (whole microseconds always are): less memory on many ranks."""
    out = {"correlation": pairs["correlation"]}
    for c in ("cpu_duration", "gpu_duration", "launch_delay"):
        narrow = pairs[c].astype(np.float32)
        out[c] = narrow if np.array_equal(narrow, pairs[c]) else pairs[c]
    return out


def _kernel_sequences(v, opts: Options) -> tuple[list[dict], list[str]]:
    """One rank's frequent kernel sequences for each requested operator (one call graph), and its notes."""
    rows: list[dict] = []
    cs = call_stack.build(v)
    notes = [f"rank {v.rank}: {n}" for n in cs.notes]
    for op in opts.kernel_sequences:
        got, why = kernel_sequences.frequent_sequences(v, cs, op, opts.min_pattern_len)
        rows += got
        if why:
            notes.append(f"rank {v.rank}: no frequent kernel sequences under {op!r}: {why}")
    return rows, notes


def one_rank(v, opts: Options, many: bool = True, keep_file=rank_csv.packed, gpu_time: bool = False) -> dict:
    """Everything computed from one rank alone (run in a worker process when there are several);
    ``many``: the set has several ranks (the straggler analysis runs); ``keep_file``: see ``analyze``;
    ``gpu_time``: also the rank's GPU time by launching stack (:mod:`.gpu_flame`)."""
    try:
        out = _rank_results(v, opts, many, keep_file)
        out["annotations"] = annotations.user_annotation_breakdown([v])
        out["sequences"] = _kernel_sequences(v, opts) if opts.kernel_sequences else ([], [])
        if gpu_time:
            from .gpu_flame import gpu_time_stacks
            out["gpu_time"] = gpu_time_stacks(v)
        out["source"] = (v.ev.path, bool(v.ev.meta.get("record_shapes")))
        return out
    finally:
        v.clear_cache()   # what the analyses shared is not kept with the rank


def _rank_results(v, opts: Options, many: bool, keep_file) -> dict:
    temporal = breakdown.temporal_breakdown(v)
    idle_rows, idle_stats = idle.idle_time_breakdown(v, opts.consecutive_kernel_delay)
    pairs = launch.launch_pairs(v)
    instances = aten_ops.op_instances(v)
    groups = aten_ops.group_instances(instances)
    aten_rows = [{"rank": v.rank, **row} for row in aten_ops.summarize_groups(groups)]
    return {
        "temporal": temporal, "idle": idle_rows, "idle_stats": idle_stats,
        "kernels": breakdown.rank_kernel_breakdown(v, opts.num_kernels, opts.duration_ratio,
                                                   opts.include_memory_kernels),
        "overlap": breakdown.comm_comp_overlap(v),
        "stragglers": stragglers.rank_part(v) if many else None, "steps": rank_steps(v),
        "launch": {"rank": v.rank, **launch.launch_summary(pairs, opts.runtime_cutoff, opts.launch_delay_cutoff)},
        "has_pairs": bool(pairs["correlation"].size), "csv": rank_csv.rank_files(v, _for_csv(pairs), keep_file),
        "queue": counters.queue_length_summary(v), "blocked": counters.blocked_on_full_queue(v, opts.max_queue_length),
        "membw": counters.memory_bw_summary(v),
        "aten": aten_rows,
        "aten_csv": (columns(aten_rows), rank_csv.pack(rows_text(aten_rows, columns(aten_rows)))),
        "aten_groups": _pack_groups(groups),
        "per_annotation": annotations.kernels_per_annotation(v),
        "checks": check_rank(v, temporal, idle_rows, opts.thresholds, None if opts.unprofiled_step_us is None
                             else opts.unprofiled_step_us.get(v.rank, float("nan"))),
        "critical_path": critical_path.one_rank(v, opts.critical_path_annotation, opts.critical_path_instance)
        if opts.critical_path else None,
    }


def _pack_groups(groups: dict) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
    """(op, sequence) groups of delays as (keys, op instances per key, op delays, runtime delays): two
    float64 arrays for all groups (8 bytes an instance, and one array to pickle instead of two per group)."""
    keys = list(groups)
    lengths = np.fromiter((len(groups[k][0]) for k in keys), dtype=np.int64, count=len(keys))
    n = int(lengths.sum())
    op = np.fromiter(chain.from_iterable(groups[k][0] for k in keys), dtype=np.float64, count=n)
    runtime = np.fromiter(chain.from_iterable(groups[k][1] for k in keys), dtype=np.float64, count=n)
    return keys, lengths, op, runtime


def _pooled_sums(packed: list[tuple]) -> dict[tuple[str, str], tuple[int, float, float]]:
    """Every rank's packed groups pooled per (op, sequence): (instances, exact sum of op delays, exact
    sum of runtime delays), as ``math.fsum`` gives them over one list of every rank's delays (exact
    whatever the order). One group's delays at a time are made Python numbers: no pooled copy of
    every rank's arrays."""
    spans: dict = {}   # (op, sequence) -> [(rank's pack, start, end)]
    for p in packed:
        keys, lengths = p[0], p[1].tolist()
        start = 0
        for k, n in zip(keys, lengths):
            spans.setdefault(k, []).append((p, start, start + n))
            start += n
    fsum = math.fsum
    return {k: (sum(e - s for _, s, e in where),
                fsum(chain.from_iterable(p[2][s:e].tolist() for p, s, e in where)),
                fsum(chain.from_iterable(p[3][s:e].tolist() for p, s, e in where)))
            for k, where in spans.items()}


def share_strings(p: dict) -> dict:
    """One rank's result with its strings (keys and values up to ``SHARED_STR_MAX`` characters)
    interned and its equal floats one object: every rank's result comes back from a worker with its
    own copies of the same keys, op, kernel and check texts; shared, the ranks' results take about a
    quarter less memory. A container referred to twice stays one object."""
    intern = sys.intern
    seen: dict[int, object] = {}
    floats: dict[float, float] = {}

    def walk(x):
        t = type(x)
        if t is str:
            return intern(x) if len(x) <= SHARED_STR_MAX else x
        if t is float:
            if x == 0.0:   # -0.0 equals 0.0 but is written "-0.0": kept apart
                return _ZERO if math.copysign(1.0, x) > 0 else x
            return floats.setdefault(x, x) if x == x else x   # (NaN is not equal to itself)
        if t is dict or t is list or t is tuple:
            got = seen.get(id(x))
            if got is None:
                if t is dict:
                    got = {walk(k): walk(v) for k, v in x.items()}
                else:
                    got = [walk(v) for v in x]
                    if t is tuple:
                        got = tuple(got)
                seen[id(x)] = got
            return got
        return x
    return walk(p)


def analyze(ts: TraceSet, opts: Options | None = None, jobs: int | None = None,
            keep_file=rank_csv.packed) -> dict:
    """All analyses of ``ts``; each rank's time-series and launch-pair CSV files are kept under
    ``_rank_csv`` as ``keep_file(name, text)`` makes them where the rank is analysed (default: the
    compressed text, see :mod:`rank_csv`; None: the files are not made).

    What each rank needs alone is computed in ``jobs`` forked workers (default one per core) when
    the set is large enough to pay for them; the result is the same either way. (For a folder,
    :func:`.set_workers.analyze_folder` reads and analyses each rank in the same worker instead.)"""
    opts = opts or Options()
    views = list(ts.ranks.values())
    if jobs is None and sum(len(v.rows) for v in views) < PARALLEL_MIN_ROWS:
        jobs = 1
    prepare_workers()
    per = fork_map(partial(one_rank, opts=opts, many=len(views) > 1, keep_file=keep_file), views, jobs,
                   post=share_strings)
    return combine(ts.path, [v.rank for v in views], per, list(ts.notes), ts.steps_filtered, opts)


def prepare_workers() -> None:
    """What to import once before worker processes fork: np.unique imports numpy.ma on its first
    call (numpy 2), once here rather than once in each worker and again in this process."""
    import numpy.ma  # noqa: F401


def combine(path: str, ranks: list[int], per: list[dict], notes: list[str], steps_filtered: bool,
            opts: Options) -> dict:
    """The result document from every rank's ``one_rank`` results (in ``ranks``' order)."""
    temporal = {r: p["temporal"] for r, p in zip(ranks, per)}
    types, kernels = breakdown.combine_kernel_breakdowns([p["kernels"] for p in per])
    idle_rows = [r for p in per for r in p["idle"]]
    idle_stats = [r for p in per for r in p["idle_stats"]]
    overlap = [p["overlap"] for p in per]
    launch_rows = [p["launch"] for p in per]
    if not any(p["has_pairs"] for p in per) and any(temporal.values()):
        notes.append("no cudaLaunchKernel/cudaMemcpyAsync/cudaMemsetAsync calls matched to GPU events: "
                     "launch statistics are empty (HTA does not pair hipLaunchKernel either)")
    if not any(temporal.values()):
        notes.append("no GPU kernels in any rank: temporal, kernel, idle, overlap and launch analyses "
                     "have nothing to measure (HTA 0.5.0 fails here); CPU-side steps and findings follow")
    queue = [r for p in per for r in p["queue"]]
    blocked = [r for p in per for r in p["blocked"]]
    membw = [r for p in per for r in p["membw"]]
    aten = [r for p in per for r in p["aten"]]
    # the all-ranks table (per-launch rows are not kept); math.fsum is exact whatever the order: the
    # pooled means are those of one list of all launches
    aten_all = aten_ops.summarize_sums(_pooled_sums([p.pop("aten_groups") for p in per]))
    paths = [p["critical_path"] for p in per] if opts.critical_path else []
    potential = stragglers.combine([p["stragglers"] for p in per], opts.straggler_candidates) if len(ranks) > 1 else \
        {"ranks": [], "counts": {}, "error": "one rank"}
    cross = cross_rank_summary(ranks, [t for t in temporal.values() if t], [p["steps"] for p in per])
    checks = finish_checks([c for p in per for c in p["checks"]], {r: p["source"] for r, p in zip(ranks, per)})
    findings = group_findings(checks, opts.thresholds)
    sequences = {}
    if opts.kernel_sequences:
        seq = [row for p in per for row in p["sequences"][0]]
        notes += [n for p in per for n in p["sequences"][1]]
        sequences = {"kernel_sequences_request": {"operators": list(opts.kernel_sequences),
                                                  "min_pattern_len": opts.min_pattern_len},
                     "kernel_sequences": seq, "kernel_sequences_all_ranks": kernel_sequences.pool_ranks(seq)}
    return {
        "trace_dir": path,
        "ranks": list(ranks),
        "files": {str(r): p["source"][0] for r, p in zip(ranks, per)},
        "notes": notes,
        "last_step_excluded": steps_filtered,
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
        "gpu_user_annotation_breakdown": sorted((r for p in per for r in p["annotations"]),
                                                key=lambda r: (r["rank"], r["name"])),
        "kernels_per_annotation": [r for p in per for r in p["per_annotation"]],
        "aten_op_kernels": aten,
        "aten_op_kernels_all_ranks": aten_all,
        "critical_path": paths,
        **sequences,
        "cross_rank": cross,
        "findings": findings,
        "checks": checks,
        "thresholds": thresholds_dict(opts.thresholds),
        "_rank_csv": [p["csv"] for p in per],  # per-rank time-series and launch-pair CSVs, as keep_file made them
        "_aten_csv": [p["aten_csv"] for p in per],  # each rank's aten_op_kernels.csv lines: (columns, compressed)
        "_gpu_time": {r: p["gpu_time"] for r, p in zip(ranks, per) if "gpu_time" in p},  # rank -> stacks (ns)
    }


def jsonable(doc: dict) -> dict:
    """The document without private keys, NaN as None (strict JSON)."""
    return json_value(doc)
