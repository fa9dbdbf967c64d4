"""Anti-pattern checks per rank: what the trace shows, where, the time at stake (us) and the usual fix.

Every check is evaluated per rank and reported in ``checks`` (measured value vs threshold,
time at stake and its share of the rank's analysed span); :mod:`.grouping` turns the ones that
trigger with enough time at stake into findings grouped across ranks.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from .breakdown import gpu_kernels, merge_intervals
from .launch import launch_pairs
from .model import COMMUNICATION, COMPUTATION, RankView
from .steps import step_of, step_windows

RUNTIME_SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize")
SCALAR_READ_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")
ALLOC_CALLS = ("cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaHostAlloc",
               "hipMalloc", "hipFree", "hipHostMalloc", "hipHostFree")
OP_CATS = ("cpu_op", "Operator", "user_annotation")

FIXES = {
    "many_short_kernels": "Launch overhead dominates: fuse small ops (torch.compile, fused optimizers "
                          "foreach/fused=True), capture the step in CUDA graphs, or raise the batch size.",
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
}
TITLES = {
    "many_short_kernels": "Many short GPU kernels (launch-bound)",
    "too_many_syncs": "Too many GPU-to-CPU synchronizations",
    "unhidden_nccl": "Long NCCL kernels not hidden behind computation",
    "long_gpu_idle": "Long GPU idle time",
    "alloc_thrash": "cudaMalloc/cudaFree thrash",
    "pageable_h2d": "Pageable host-to-device copies",
}


@dataclass
class Thresholds:
    """When a check becomes a finding (us for times, % for shares)."""

    short_kernel_share_pct: float = 30.0  # share of launches with gpu < cpu duration
    short_kernel_min_count: int = 100
    runtime_cutoff_us: float = 50.0
    syncs_per_step: float = 2.0
    nccl_exposed_pct: float = 10.0  # exposed comm time / kernel span
    nccl_long_us: float = 1000.0  # a comm kernel with at least this much exposed time counts
    idle_pct: float = 20.0
    alloc_per_step: float = 1.0
    alloc_min_count: int = 10
    pageable_min_count: int = 1
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
    c = Counter(v.names[int(n)] for n in names[j[found]].tolist())
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


def _overlap(a0: np.ndarray, a1: np.ndarray, b0: np.ndarray, b1: np.ndarray) -> float:
    """Total overlap (us) of intervals [a0, a1) with the disjoint sorted intervals [b0, b1)."""
    if not len(a0) or not len(b0):
        return 0.0
    cover = np.r_[0.0, np.cumsum(b1 - b0)]

    def before(t: np.ndarray) -> np.ndarray:  # covered time before t
        j = np.searchsorted(b0, t, "right")
        jm = np.maximum(j - 1, 0)
        inside = np.clip(np.minimum(t, b1[jm]) - b0[jm], 0, None)
        return np.where(j > 0, cover[jm] + inside, 0.0)
    return float((before(a1) - before(a0)).sum())


def _gap_starts_inside(gap_s: np.ndarray, gap_e: np.ndarray, call_s: np.ndarray, call_e: np.ndarray) -> float:
    """Idle time (us) of the gaps that begin while one of the calls runs (the GPU drained during it)."""
    if not len(gap_s) or not len(call_s):
        return 0.0
    cs, ce = merge_intervals(call_s, call_e)
    j = np.searchsorted(cs, gap_s, "right") - 1
    inside = (j >= 0) & (gap_s <= ce[np.maximum(j, 0)])
    return float((gap_e - gap_s)[inside].sum())


class _Checker:
    def __init__(self, v: RankView, th: Thresholds, temporal: dict | None):
        self.v, self.th = v, th
        self.windows = step_windows(v)
        self.nsteps = max(1, len({w[0] for w in self.windows}))
        self.ops = _op_by_external_id(v)
        self.k = gpu_kernels(v)
        self.gap_s, self.gap_e = _gaps(self.k)
        self.span_us, self.span_kind = self._span(temporal)
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

    def report(self, pattern: str, indicator: str, value: float, threshold: float, triggered: bool,
               where: dict | None = None, at_stake: float = 0.0, **evidence) -> None:
        share = 100.0 * at_stake / self.span_us if self.span_us > 0 else 0.0
        self.checks.append({"pattern": pattern, "rank": self.v.rank, "indicator": indicator,
                            "value": round(float(value), 3), "threshold": threshold, "triggered": bool(triggered),
                            "time_at_stake_us": round(float(at_stake), 1), "span_us": round(self.span_us, 1),
                            "span": self.span_kind, "share_of_span_pct": round(share, 3),
                            "reported": bool(triggered) and share >= self.th.min_time_share_pct,
                            "where": where or {}, **{k: round(float(x), 1) for k, x in evidence.items()}})

    def rows_named(self, names, rows: np.ndarray | None = None) -> np.ndarray:
        rows = self.v.rows if rows is None else rows
        return rows[np.isin(self.v.ev.name[rows], self.v.symbol_ids(names))]

    def short_kernels(self) -> None:
        p = launch_pairs(self.v)
        n = len(p["cpu_duration"])
        short = (p["cpu_duration"] <= self.th.runtime_cutoff_us) & (p["gpu_duration"] < p["cpu_duration"])
        share = 100.0 * short.sum() / n if n else 0.0
        hit = n > 0 and short.sum() >= self.th.short_kernel_min_count and share >= self.th.short_kernel_share_pct
        g = p["gpu_rows"][short]
        where = {"kernels": _names_of(self.v, g), "ops": _ops_of(self.v, p["cpu_rows"][short], self.ops),
                 "streams": sorted(set(self.v.ev.stream[g].tolist()))[:10],
                 "steps": _steps_of(self.v, p["cpu_rows"][short], self.windows), "count": int(short.sum()),
                 "launches": n}
        at_stake = float((p["cpu_duration"][short] - p["gpu_duration"][short]).sum())
        # GPU idle that ends when a short kernel starts: the GPU was waiting for its launch
        short_starts = np.sort((self.v.ev.ts[g] - self.v.ts0).astype(np.float64))
        waiting = np.isin(self.gap_e, short_starts)
        self.report("many_short_kernels", "short kernels, % of launches", share,
                    self.th.short_kernel_share_pct, hit, where, at_stake,
                    idle_caused_us=float((self.gap_e - self.gap_s)[waiting].sum()))

    def syncs(self) -> None:
        rt = self.rows_named(RUNTIME_SYNC)
        rows = rt if len(rt) else self.rows_named(SCALAR_READ_OPS)
        per_step = len(rows) / self.nsteps
        ops = _ops_of(self.v, rows, self.ops) if len(rt) else _names_of(self.v, rows)
        where = {"ops": ops, "calls": _names_of(self.v, rows), "steps": _steps_of(self.v, rows, self.windows),
                 "count": int(len(rows))}
        s0, s1 = self.intervals(rows)
        comm = self.k["type"] == COMMUNICATION
        c0, c1 = merge_intervals(self.k["ts"][comm], self.k["end"][comm])
        nccl_wait = _overlap(s0, s1, c0.astype(np.float64), c1.astype(np.float64))
        total = float((s1 - s0).sum())
        # waiting for a collective is not recovered by removing the sync: left out of the time at stake
        self.report("too_many_syncs", self.per_step("host syncs"), per_step, self.th.syncs_per_step,
                    per_step > self.th.syncs_per_step, where, max(0.0, total - nccl_wait),
                    nccl_wait_us=nccl_wait, idle_caused_us=_gap_starts_inside(self.gap_s, self.gap_e, s0, s1))

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
        cover = np.r_[0.0, np.cumsum(ce - cs)]

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
        where = {"largest_gaps": [{"start_us": float(e[i]), "length_us": float(gaps[i]),
                                   "step": int(step_of(np.array([float(e[i])]), self.windows)[0])}
                                  for i in top if gaps[i] > 0],
                 "stream_idle_by_category_us": dict(by_cat.most_common())}
        pct = temporal["idle_time_pctg"]
        pct = 0.0 if pct != pct else pct  # no span (a single instant): nothing idle
        self.report("long_gpu_idle", "GPU idle, % of GPU span", pct, self.th.idle_pct, pct >= self.th.idle_pct,
                    where, temporal["idle_time_us"])

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
                    idle_caused_us=_gap_starts_inside(self.gap_s, self.gap_e, s0, s1))

    def pageable(self) -> None:
        ids = [i for i, n in enumerate(self.v.names) if "HtoD" in n and "Pageable" in n]
        rows = self.v.rows[np.isin(self.v.ev.name[self.v.rows], ids) & (self.v.ev.stream[self.v.rows] >= 0)]
        where = {"copies": _names_of(self.v, rows), "ops": _ops_of(self.v, rows, self.ops),
                 "streams": sorted(set(self.v.ev.stream[rows].tolist())),
                 "steps": _steps_of(self.v, rows, self.windows), "count": int(len(rows))}
        self.report("pageable_h2d", "pageable H2D copies", len(rows), self.th.pageable_min_count,
                    len(rows) >= self.th.pageable_min_count, where, float(np.maximum(self.v.ev.dur[rows], 0).sum()))


def check_ranks(views: list[RankView], temporal: dict[int, dict | None], idle_rows: list[dict],
                th: Thresholds | None = None) -> list[dict]:
    """Every check on every rank, with its measured value, time at stake and evidence."""
    th = th or Thresholds()
    checks: list[dict] = []
    for v in views:
        c = _Checker(v, th, temporal.get(v.rank))
        c.short_kernels()
        c.syncs()
        c.nccl(temporal.get(v.rank))
        c.idle(temporal.get(v.rank), idle_rows)
        c.alloc()
        c.pageable()
        checks += c.checks
    return checks


def thresholds_dict(th: Thresholds) -> dict:
    return asdict(th)
