"""Anti-pattern checks per rank: what the trace shows, where, the time at stake (us) and the usual fix.

Every check is evaluated per rank and reported in ``checks`` (measured value vs threshold,
time at stake and its share of the rank's analysed span); :mod:`.grouping` turns the ones that
trigger with enough time at stake into findings grouped across ranks.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from . import antipatterns
from .breakdown import gpu_kernels, merge_intervals
from .counters import queue_length_at, queue_length_series
from .idle_causes import (ALLOC_CALLS, CAUSES, attribute_idle, idle_cause_summary, overlap, partner_rows,
                          where_in_step)
from .launch import launch_pairs
from .model import COMMUNICATION, COMPUTATION, RankView, id_in
from .profiler_share import profiler_share
from .run_features import launch_bound_fix, run_features
from .steps import step_of, step_windows
from .sync_calls import RUNTIME_SYNC, classify_syncs, scopes_of  # noqa: F401 (RUNTIME_SYNC re-exported)

SCALAR_READ_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")
OP_CATS = ("cpu_op", "Operator", "user_annotation")

FIXES = {
    "many_short_kernels": "The GPU waits for the CPU to launch work: fuse small ops (torch.compile), capture the "
                          "step in CUDA graphs, use a fused optimizer, or raise the batch size.",
    "too_many_syncs": "Each sync stalls the CPU until the GPU drains: remove .item()/.cpu()/print of "
                      "tensors and nonzero/boolean-mask indexing from the step, log losses every N steps, "
                      "keep control flow on device.",
    "unhidden_nccl": "Communication is not overlapped with compute: enable overlap (DDP buckets, "
                     "FSDP/ZeRO-3 overlap_comm and prefetch sizes), avoid syncs before collectives, and "
                     "check for a straggler rank that the others wait for.",
    "long_gpu_idle": "The GPU waits: if host wait dominates the CPU is the bottleneck (more DataLoader "
                     "workers, pin_memory, CUDA graphs, torch.compile); otherwise look for syncs and "
                     "cross-stream waits in the biggest gaps.",
    "alloc_thrash": "Memory is allocated and freed through the driver every step: drop "
                    "torch.cuda.empty_cache() from the loop, set PYTORCH_CUDA_ALLOC_CONF="
                    "expandable_segments:True, keep tensor shapes static.",
    "pageable_h2d": "Host-to-device copies from pageable memory are slow and block the host: "
                    "DataLoader(pin_memory=True) or tensor.pin_memory(), then .to(device, non_blocking=True).",
    "queue_drain_sync": "A sync in the step throws away the launch queue: everything the CPU does next is exposed. "
                        "Keep the value on the GPU and read it every N steps (loss.detach() accumulated, "
                        "logged every N), or copy it with .to('cpu', non_blocking=True) into pinned memory and "
                        "read it after the next step is launched.",
    "gemm_misaligned": "Pad the dimension to a multiple of 8 for bf16/fp16 (64 is better; 4 for tf32, 16 for "
                       "fp8): e.g. a vocabulary of 50,257 -> 50,304 (GPT2Config(vocab_size=50304), "
                       "resize_token_embeddings(n, pad_to_multiple_of=64)); likewise hidden sizes, heads x "
                       "head_dim and batch x sequence.",
    "gemm_old_arch": "The GEMM library fell back to kernels of an older GPU generation: usually a dimension "
                     "that is not a multiple of 8/16 (pad it), otherwise a PyTorch/cuBLAS build without kernels "
                     "for this GPU (update) or a layout it does not take (make operands contiguous).",
    "gemm_fp32": "These GEMMs run in fp32 without tensor cores in a bf16/fp16 run: put them under "
                 "torch.autocast or cast the module; where fp32 is intended, allow TF32 "
                 "(torch.set_float32_matmul_precision('high')).",
}
TITLES = {
    "many_short_kernels": "Launch-bound: the GPU waits for many short kernels",
    "too_many_syncs": "Too many GPU-to-CPU synchronizations",
    "unhidden_nccl": "Long NCCL kernels not hidden behind computation",
    "long_gpu_idle": "Long GPU idle time",
    "alloc_thrash": "cudaMalloc/cudaFree thrash",
    "pageable_h2d": "Pageable host-to-device copies",
    "queue_drain_sync": "A sync drains the GPU queue every step",
    "gemm_misaligned": "GEMM kernels for misaligned shapes (no full-width tensor-core loads)",
    "gemm_old_arch": "GEMM kernels built for an older GPU generation",
    "gemm_fp32": "fp32 GEMMs without tensor cores in a 16-bit run",
}


@dataclass
class Thresholds:
    """When a check becomes a finding (us for times, % for shares)."""

    short_kernel_share_pct: float = 30.0  # share of launches with gpu < cpu duration
    short_kernel_min_count: int = 100
    launch_starved_pct: float = 5.0  # GPU idle waiting for launches, % of the GPU span: launch-bound from here
    runtime_cutoff_us: float = 50.0
    syncs_per_step: float = 2.0
    nccl_exposed_pct: float = 10.0  # exposed comm time / kernel span
    nccl_long_us: float = 1000.0  # a comm kernel with at least this much exposed time counts
    idle_pct: float = 20.0
    alloc_per_step: float = 1.0
    alloc_min_count: int = 10
    pageable_min_count: int = 1
    short_event_sync_us: float = 20.0  # a cudaEventSynchronize this short drained nothing: not the user's problem
    drain_steps_pct: float = 50.0  # steps with a sync at which the GPU ran dry
    drain_min_count: int = 2  # the same without ProfilerStep annotations: drains in the trace
    gemm_misaligned_pct: float = 5.0  # % of GEMM kernel time
    gemm_old_arch_pct: float = 10.0
    gemm_fp32_pct: float = 5.0
    low_precision_gemm_pct: float = 10.0  # 16/8-bit GEMMs take this % of GEMM time: a low-precision run
    min_time_share_pct: float = 1.0  # report only when time at stake >= this % of the analysed span
    link_min_share_pct: float = 10.0  # cause -> GPU idle link when the cause explains >= this % of the idle


def _names_of(v: RankView, rows: np.ndarray, top: int = 5) -> list[list]:
    return [[v.names[n], c] for n, c in Counter(v.ev.name[rows].tolist()).most_common(top)]


def _op_by_external_id(v: RankView) -> tuple[np.ndarray, np.ndarray]:
    """(sorted external ids of CPU ops, their name ids) for lookups."""
    ev = v.ev
    rows = np.flatnonzero(np.isin(ev.cat, v.symbol_ids(OP_CATS)) & (ev.external_id >= 0))
    order = np.argsort(ev.external_id[rows], kind="stable")
    return ev.external_id[rows][order], ev.name[rows][order]


def _ops_of(v: RankView, rows: np.ndarray, ops: tuple[np.ndarray, np.ndarray], top: int = 5) -> list[list]:
    """Most frequent CPU ops (by external id) behind the given rows; "?" when unknown."""
    keys, names = ops
    ext = v.ev.external_id[rows]
    if len(keys) == 0 or len(ext) == 0:
        return [["?", int(len(ext))]] if len(ext) else []
    j = np.minimum(np.searchsorted(keys, ext), len(keys) - 1)
    found = keys[j] == ext
    c: Counter = Counter()
    for n, k in Counter(names[j[found]].tolist()).items():   # name ids counted, then named in first-seen order
        c[v.names[n]] += k
    if (~found).any():
        c["?"] += int((~found).sum())
    return [[k, n] for k, n in c.most_common(top)]


def _steps_of(v: RankView, rows: np.ndarray, windows) -> list[int]:
    steps = step_of((v.ev.ts[rows] - v.ts0).astype(np.float64), windows)
    return sorted(set(steps[steps >= 0].tolist()))


def _gaps(k: dict) -> tuple[np.ndarray, np.ndarray]:
    """GPU idle gaps of a rank: (start us, end us) between merged kernel intervals."""
    s, e = merge_intervals(k["ts"], k["end"])
    return e[:-1].astype(np.float64), s[1:].astype(np.float64)


class _Checker:
    def __init__(self, v: RankView, th: Thresholds, temporal: dict | None, unprofiled_step_us: float | None = None):
        self.v, self.th = v, th
        self.unprofiled_step_us = unprofiled_step_us
        self.windows = step_windows(v)
        self.nsteps = max(1, len({w[0] for w in self.windows}))
        self.ops = _op_by_external_id(v)
        self.k = gpu_kernels(v)
        self.gap_s, self.gap_e = _gaps(self.k)
        self.span_us, self.span_kind = self._span(temporal)
        self.sync_cls = classify_syncs(v, th.short_event_sync_us)
        self.att = attribute_idle(v, self.k, self.windows, self.sync_cls) if len(self.k["ts"]) else None
        self.features = run_features(v)
        self._queue: dict | None = None
        self.checks: list[dict] = []

    def _span(self, temporal: dict | None) -> tuple[float, str]:
        """What time at stake is a share of: the GPU span, else the analysed steps, else the trace."""
        if temporal and temporal["kernel_time_us"] > 0:
            return float(temporal["kernel_time_us"]), "GPU span"
        if self.windows:
            return float(sum(b - a for _, a, b in self.windows)), "steps"
        ts = self.v.ev.ts[self.v.rows].astype(np.float64)
        end = ts + np.maximum(self.v.ev.dur[self.v.rows], 0)
        return (float(end.max() - ts.min()) if len(ts) else 0.0), "trace"

    def per_step(self, label: str) -> str:
        return f"{label} per step" if self.windows else f"{label} in the trace (no ProfilerStep)"

    def idle_of(self, cause: str) -> float:
        """GPU idle (us) in the gaps attributed to ``cause`` (see :mod:`.idle_causes`)."""
        return float(self.att["by_cause_us"].get(cause, 0.0)) if self.att else 0.0

    def report(self, pattern: str, indicator: str, value: float, threshold: float, triggered: bool,
               where: dict | None = None, at_stake: float = 0.0, fix: str | None = None,
               _shape_ext: list | None = None, **evidence) -> None:
        share = 100.0 * at_stake / self.span_us if self.span_us > 0 else 0.0
        check = {"pattern": pattern, "rank": self.v.rank, "indicator": indicator,
                 "value": round(float(value), 3), "threshold": threshold, "triggered": bool(triggered),
                 "time_at_stake_us": round(float(at_stake), 1), "span_us": round(self.span_us, 1),
                 "span": self.span_kind, "share_of_span_pct": round(share, 3),
                 "reported": bool(triggered) and share >= self.th.min_time_share_pct,
                 "where": where or {}, "fix": fix or FIXES[pattern],
                 **{k: round(float(x), 1) for k, x in evidence.items()}}
        if _shape_ext is not None and check["reported"]:
            check["_shape_ext"] = _shape_ext
        self.checks.append(check)

    def rows_named(self, names, rows: np.ndarray | None = None) -> np.ndarray:
        rows = self.v.rows if rows is None else rows
        return rows[id_in(self.v.ev, self.v.ev.name[rows], self.v.symbol_ids(names))]

    def names_of(self, rows: np.ndarray) -> list[list]:
        return _names_of(self.v, rows)

    def ops_of(self, rows: np.ndarray) -> list[list]:
        return _ops_of(self.v, rows, self.ops)

    def steps_of(self, rows: np.ndarray) -> list[int]:
        return _steps_of(self.v, rows, self.windows)

    def step_of_time(self, t: float) -> int:
        return int(step_of(np.array([t]), self.windows)[0])

    def queue_depth_at(self, times: np.ndarray) -> np.ndarray:
        """Launches outstanding on all streams (queue length summed) at each time (us)."""
        if self._queue is None:
            self._queue = queue_length_series(self.v)
        out = np.zeros(len(times))
        for ts, q in self._queue.values():
            j = np.searchsorted(ts, times, "right") - 1
            out += np.where(j >= 0, q[np.maximum(j, 0)], 0)
        return out

    def short_kernels(self) -> None:
        """Launch-bound only when the GPU actually waited for launches: many short kernels *and* GPU
        idle in gaps ended by a launch the CPU had not finished when the GPU ran dry, with no drained
        queue being refilled (see :mod:`.idle_causes`); stated with the profiler's possible share."""
        p = launch_pairs(self.v)
        n = len(p["cpu_duration"])
        short = (p["cpu_duration"] <= self.th.runtime_cutoff_us) & (p["gpu_duration"] < p["cpu_duration"])
        share = 100.0 * short.sum() / n if n else 0.0
        starved = self.idle_of("launch_starvation")
        starved_pct = 100.0 * starved / self.span_us if self.span_us > 0 else 0.0
        many = n > 0 and short.sum() >= self.th.short_kernel_min_count and share >= self.th.short_kernel_share_pct
        g = p["gpu_rows"][short]
        where = {"kernels": _names_of(self.v, g), "ops": _ops_of(self.v, p["cpu_rows"][short], self.ops),
                 "streams": sorted(set(self.v.ev.stream[g].tolist()))[:10],
                 "steps": _steps_of(self.v, p["cpu_rows"][short], self.windows), "count": int(short.sum()),
                 "launches": n, "short_kernels_pct": round(share, 1), **(self._queue_evidence(p) if many else {}),
                 "profiler_overhead": profiler_share(self.windows, self.unprofiled_step_us)}
        self.report("many_short_kernels", "GPU idle waiting for launches, % of GPU span", starved_pct,
                    self.th.launch_starved_pct, many and starved_pct >= self.th.launch_starved_pct, where, starved,
                    fix=launch_bound_fix(self.features), idle_caused_us=starved)

    def _queue_evidence(self, p: dict) -> dict:
        """Median launch-queue length just after each launch call, and launches delayed past the cutoff."""
        if not len(p["cpu_rows"]):
            return {}
        depth = queue_length_at(self.v, self.v.ev.index[p["cpu_rows"]])
        late = p["launch_delay"] > 100
        return {"median_queue_at_launch": float(np.median(depth)) if len(depth) else None,
                "launches_delayed_over_100us_pct": round(100.0 * float(late.mean()), 1)}

    def syncs(self) -> None:
        """The user's own syncs per step; framework-internal and short event syncs are shown apart."""
        cls = self.sync_cls
        rt = cls["rows"]
        user = rt[cls["user"]]
        rows = user if len(rt) else self.rows_named(SCALAR_READ_OPS)
        per_step = len(rows) / self.nsteps
        ops = _ops_of(self.v, rows, self.ops) if len(rt) else _names_of(self.v, rows)
        where = {"ops": ops, "calls": _names_of(self.v, rows), "steps": _steps_of(self.v, rows, self.windows),
                 "count": int(len(rows))}
        other = rt[~cls["user"]]
        if len(other):
            where["not_counted"] = {"framework": int(cls["framework"].sum()), "short_event": int(cls["short_event"].sum()),
                                    "per_step": round(len(other) / self.nsteps, 2),
                                    "scopes": scopes_of(self.v, rt[cls["framework"]])}
        s0, s1 = self.intervals(rows)
        comm = self.k["type"] == COMMUNICATION
        c0, c1 = merge_intervals(self.k["ts"][comm], self.k["end"][comm])
        nccl_wait = overlap(s0, s1, c0.astype(np.float64), c1.astype(np.float64))
        total = float((s1 - s0).sum())
        # waiting for a collective is not recovered by removing the sync: left out of the time at stake
        self.report("too_many_syncs", self.per_step("user host syncs"), per_step, self.th.syncs_per_step,
                    per_step > self.th.syncs_per_step, where, max(0.0, total - nccl_wait),
                    nccl_wait_us=nccl_wait, idle_caused_us=self.idle_of("sync_drain"))

    def intervals(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) us of rows, relative to the set's start."""
        s0 = (self.v.ev.ts[rows] - self.v.ts0).astype(np.float64)
        return s0, s0 + np.maximum(self.v.ev.dur[rows], 0)

    def nccl(self, temporal: dict | None) -> None:
        k = self.k
        comm = k["type"] == COMMUNICATION
        if not comm.any() or not temporal:
            self.report("unhidden_nccl", "exposed communication, % of GPU span", 0.0,
                        self.th.nccl_exposed_pct, False)
            return
        cs, ce = merge_intervals(k["ts"][k["type"] == COMPUTATION], k["end"][k["type"] == COMPUTATION])
        cover = np.concatenate(([0.0], np.cumsum(ce - cs)))

        def covered(t: np.ndarray) -> np.ndarray:  # computation time before t
            j = np.searchsorted(cs, t, "right")
            inside = np.where(j > 0, np.minimum(t, ce[np.maximum(j - 1, 0)]) - cs[np.maximum(j - 1, 0)], 0)
            return cover[np.maximum(j - 1, 0)] * (j > 0) + np.maximum(inside, 0)
        a, b = k["ts"][comm].astype(np.float64), k["end"][comm]
        exposed = (b - a) - (covered(b) - covered(a)) if len(cs) else (b - a)
        ms, me = merge_intervals(k["ts"][comm], k["end"][comm])
        total_exposed = float((me - ms).sum()) - (
            float((covered(me) - covered(ms.astype(np.float64))).sum()) if len(cs) else 0.0)
        pct = 100.0 * total_exposed / temporal["kernel_time_us"] if temporal["kernel_time_us"] else 0.0
        long_ = exposed >= self.th.nccl_long_us
        rows = k["rows"][comm][long_]
        where = {"kernels": _names_of(self.v, rows), "streams": sorted(set(self.v.ev.stream[rows].tolist())),
                 "steps": _steps_of(self.v, rows, self.windows), "count": int(long_.sum()),
                 "longest_exposed_us": float(exposed.max())}
        self.report("unhidden_nccl", "exposed communication, % of GPU span", pct, self.th.nccl_exposed_pct,
                    pct >= self.th.nccl_exposed_pct and long_.any(), where, float(exposed[long_].sum()))

    def idle(self, temporal: dict | None, idle_rows: list[dict]) -> None:
        """GPU idle, with each gap attributed to its cause (see :mod:`.idle_causes`)."""
        if not temporal:
            self.report("long_gpu_idle", "GPU idle, % of GPU span", 0.0, self.th.idle_pct, False)
            return
        e = self.gap_s
        gaps = self.gap_e - self.gap_s
        top = np.argsort(-gaps, kind="stable")[:5]
        by_cat = Counter()
        for r in idle_rows:
            if r["rank"] == self.v.rank:
                by_cat[r["idle_category"]] += r["idle_time"]
        att = self.att

        def cause_of(t: float) -> str:  # the cause of the gap starting at t
            if att is None or not len(att["gap_start"]):
                return ""
            j = int(np.searchsorted(att["gap_start"], t))
            return CAUSES[int(att["cause"][j])] if j < len(att["gap_start"]) and att["gap_start"][j] == t else ""
        where = {"idle_causes": idle_cause_summary(att) if att else [],
                 "idle_by_cause_us": att["by_cause_us"] if att else {},
                 "idle_by_cause_pct": att["share_pct"] if att else {},
                 "idle_fill_us": att["fill_us"] if att else {},
                 "end_of_step_idle_us": att["end_of_step_us"] if att else 0.0,
                 "largest_gaps": [{"start_us": float(e[i]), "length_us": float(gaps[i]),
                                   "step": where_in_step(float(e[i]), self.windows)[0],
                                   "position_in_step_pct": where_in_step(float(e[i]), self.windows)[1],
                                   "cause": cause_of(float(e[i]))}
                                  for i in top if gaps[i] > 0],
                 "stream_idle_by_category_us": dict(by_cat.most_common())}
        pct = temporal["idle_time_pctg"]
        pct = 0.0 if pct != pct else pct  # no span (a single instant): nothing idle
        self.report("long_gpu_idle", "GPU idle, % of GPU span", pct, self.th.idle_pct, pct >= self.th.idle_pct,
                    where, temporal["idle_time_us"], fix=antipatterns.idle_fix(att))

    def alloc(self) -> None:
        rows = self.rows_named(ALLOC_CALLS)
        if self.nsteps > 1:  # the first step allocates legitimately: count the later ones
            steps = step_of((self.v.ev.ts[rows] - self.v.ts0).astype(np.float64), self.windows)
            later = rows[steps != min(w[0] for w in self.windows)]
            per_step = len(later) / (self.nsteps - 1)
            label = "malloc/free calls per step (after the first)"
        else:
            later, per_step, label = rows, float(len(rows)), self.per_step("malloc/free calls")
        hit = len(later) >= self.th.alloc_min_count and per_step > self.th.alloc_per_step
        where = {"calls": _names_of(self.v, rows), "ops": _ops_of(self.v, rows, self.ops),
                 "steps": _steps_of(self.v, rows, self.windows), "count": int(len(rows))}
        s0, s1 = self.intervals(later)
        self.report("alloc_thrash", label, per_step, self.th.alloc_per_step, hit, where, float((s1 - s0).sum()),
                    idle_caused_us=self.idle_of("allocator"))

    def pageable(self) -> None:
        """Pageable H2D copies; those the GPU waited for (a gap ends where the copy starts) are on the
        step's critical path, and the idle in gaps that began inside a host-to-device copy call is linked."""
        ids = [i for i, n in enumerate(self.v.names) if "HtoD" in n and "Pageable" in n]
        rows = self.v.rows[id_in(self.v.ev, self.v.ev.name[self.v.rows], ids) & (self.v.ev.stream[self.v.rows] >= 0)]
        calls = partner_rows(self.v, rows)
        calls = calls[calls >= 0]
        c0, c1 = merge_intervals(*self.intervals(calls))
        blocked_idle = overlap(self.gap_s, self.gap_e, c0.astype(np.float64), c1.astype(np.float64))
        where = {"copies": _names_of(self.v, rows), "ops": _ops_of(self.v, rows, self.ops),
                 "streams": sorted(set(self.v.ev.stream[rows].tolist())),
                 "steps": _steps_of(self.v, rows, self.windows), "count": int(len(rows)),
                 "copy_calls_us": round(float((c1 - c0).sum()), 1), "gpu_idle_during_calls_us": round(blocked_idle, 1)}
        gpu_us = float(np.maximum(self.v.ev.dur[rows], 0).sum())
        # at stake: the copies' GPU time and the GPU idle while the CPU was blocked in their calls
        self.report("pageable_h2d", self.per_step("pageable H2D copies"), len(rows) / self.nsteps
                    if self.windows else float(len(rows)), self.th.pageable_min_count,
                    len(rows) >= self.th.pageable_min_count, where, gpu_us + blocked_idle,
                    idle_caused_us=blocked_idle, _shape_ext=self.v.ev.external_id[rows].tolist())


def check_ranks(views: list[RankView], temporal: dict[int, dict | None], idle_rows: list[dict],
                th: Thresholds | None = None) -> list[dict]:
    """Every check on every rank, with its measured value, time at stake and evidence."""
    th = th or Thresholds()
    checks: list[dict] = []
    for v in views:
        checks += check_rank(v, temporal.get(v.rank), idle_rows, th)
    return finish_checks(checks, {v.rank: (v.ev.path, bool(v.ev.meta.get("record_shapes"))) for v in views})


def check_rank(v: RankView, temporal: dict | None, idle_rows: list[dict], th: Thresholds,
               unprofiled_step_us: float | None = None) -> list[dict]:
    """Every check on one rank (``finish_checks`` then names shapes across ranks); ``unprofiled_step_us``:
    the median step time (us) of the same job unprofiled, for the profiler's share (see :mod:`.profiler_share`)."""
    c = _Checker(v, th, temporal, unprofiled_step_us)
    c.short_kernels()
    c.syncs()
    antipatterns.queue_drain_sync(c)
    c.nccl(temporal)
    c.idle(temporal, idle_rows)
    c.alloc()
    c.pageable()
    antipatterns.gemm_checks(c)
    return c.checks


def finish_checks(checks: list[dict], sources: dict[int, tuple[str, bool]]) -> list[dict]:
    """The checks of every rank, in rank order, with the worst pattern's shapes named; ``sources``:
    rank -> (its trace file, whether the trace recorded shapes)."""
    antipatterns.add_shapes(checks, sources)
    return checks


def thresholds_dict(th: Thresholds) -> dict:
    return asdict(th)
