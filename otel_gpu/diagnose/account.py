"""Where a job's time went, from 100% of its ranks' wall time down to MFU: one account (pure).

The whole is the ranks' wall time in the window (rank-seconds). The host side is split by what the
training hooks measured: data wait, exposed communication (collectives the host blocked in: gloo, or a
host-timed wait; GPU-timed NCCL time may overlap compute and is not charged here), checkpoint, evaluation
(each with the collective waits inside it), the job's own phases, and unphased host time (what no phase
covers: the rest). What the compute phases (forward, backward, optimizer) hold is split on the GPU side:
GPU idle (1 - NVML utilization of the ranks' GPUs), GPU busy below peak, and MFU.

The parts add up to 100% by construction. Counters read at export edges can make the measured parts
exceed the wall time (a sleepy loader's data wait at 100.1%): they are then scaled down together to the
wall time, and the account says by how much. Where the GPU was busy longer than the compute phases lasted
(work queued asynchronously and running during the data wait or a collective), that time stays with the
host part it overlapped, and the account says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import fmt
from .mfu import JobWork, job_work, mfu_pct, tflops
from .model import Window

COMPUTE = ("forward", "backward", "optimizer")
HOST_PARTS = ("data_wait", "communication", "checkpoint", "eval", "own_phases", "unphased")


@dataclass
class Part:
    key: str      # data_wait, communication, checkpoint, eval, own_phases, unphased, compute, gpu_idle, gpu_below_peak, mfu
    label: str
    share: float  # of the ranks' wall time, 0..1
    basis: str


@dataclass
class Account:
    parts: list[Part] = field(default_factory=list)
    total_s: float = 0.0      # the ranks' wall time, rank-seconds
    notes: list[str] = field(default_factory=list)
    why_not: str = ""
    work: JobWork | None = None

    def as_dict(self) -> dict:
        return {"total_rank_s": round(self.total_s, 3), "why_not": self.why_not, "notes": list(self.notes),
                "parts": [{"key": p.key, "label": p.label, "share": p.share, "basis": p.basis}
                          for p in self.parts]}

    def lines(self) -> list[str]:
        """The account as text lines: one per part, then its notes."""
        if self.why_not:
            return [self.why_not]
        out = [f"{p.label:<34} {(mfu_pct if p.key == 'mfu' else fmt.pct)(p.share):>6}  ({p.basis})" for p in self.parts]
        return out + [f"note: {n}" for n in self.notes]


def _host_seconds(w: Window) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """Rank-seconds per host part (unphased not yet), compute seconds per phase, and notes."""
    parts = dict.fromkeys(HOST_PARTS[:-1], 0.0)
    compute = dict.fromkeys(COMPUTE, 0.0)
    notes: list[str] = []
    own: set[str] = set()
    gpu_timed = []
    for r in w.ranks:
        for phase, s in r.phases.items():
            if phase in COMPUTE:
                compute[phase] += s
            elif phase in ("data_wait", "checkpoint", "eval"):
                parts[phase] += s
            else:
                parts["own_phases"] += s
                own.add(phase)
        if (r.collective_basis or "host") == "host":   # "" on series from before the basis: host
            for phase, s in r.collective_by_phase.items():
                parts[phase if phase in ("checkpoint", "eval") else "communication"] += s
        elif r.collective_basis:
            gpu_timed.append(r.rank)
    if own:
        notes.append(f"the job's own phases: {', '.join(sorted(own))}")
    if gpu_timed:
        notes.append(f"ranks {fmt.compact(gpu_timed)}: collectives GPU-timed (NCCL) or mixed; how much of them stalled "
                     f"compute is not measured, so none is charged to communication (it lies inside the other parts)")
    return parts, compute, notes


def account(w: Window, work: JobWork | None = None) -> Account:
    """The job's account over window `w` (work: its `job_work`, computed here when not given)."""
    work = work if work is not None else job_work(w)
    total = sum(w.rank_wall_s(r) for r in w.ranks)
    acc = Account(total_s=total, work=work)
    if not w.ranks or total <= 0:
        acc.why_not = "not checked: no rank with wall time in the window"
        return acc
    host, compute, acc.notes = _host_seconds(w)
    measured = sum(host.values()) + sum(compute.values())
    scale = 1.0
    if measured > total:
        scale = total / measured
        acc.notes.append(f"the measured phases and waits add up to {fmt.pct(measured / total)} of the wall time "
                         f"(counters read at export times on both edges of the window); every part scaled by "
                         f"{scale:.4f} so they add up to 100%")
    shares = {k: v * scale / total for k, v in host.items()}
    shares["unphased"] = max(0.0, 1.0 - (measured * scale) / total)
    P = sum(compute.values()) * scale / total
    labels = {"data_wait": ("data wait", "DataLoader fetch time (data_wait phase)"),
              "communication": ("exposed communication", "host-blocked collective waits outside checkpoint and eval"),
              "checkpoint": ("checkpoint", "checkpoint phase and the collective waits inside it"),
              "eval": ("evaluation", "eval phase and the collective waits inside it"),
              "own_phases": ("the job's own phases", "phases the job named itself"),
              "unphased": ("unphased host time", "wall time no phase or wait covers")}
    for key in HOST_PARTS:
        acc.parts.append(Part(key, labels[key][0], shares[key], labels[key][1]))
    acc.parts += _compute_parts(w, work, P, acc.notes)
    return acc


def _gpu_util(w: Window, work: JobWork) -> float | None:
    """Mean NVML utilization of the ranks' GPUs (all the window's GPUs when no rank maps to one)."""
    mine = {x.gpu for x in work.ranks if x.gpu}
    vals = [g.util for g in w.gpus if (g.name in mine or not mine) and g.util is not None]
    return sum(vals) / len(vals) if vals else None


def _compute_parts(w: Window, work: JobWork, P: float, notes: list[str]) -> list[Part]:
    phases = "forward, backward, optimizer"
    if not w.gpus:
        return [Part("compute", "compute phases", P, f"{phases}; not split: no GPU")]
    util = _gpu_util(w, work)
    m = work.mfu
    if util is None:
        if m is None:
            return [Part("compute", "compute phases", P, f"{phases}; not split: GPU utilization not read, MFU "
                                                            f"{work.why_not or 'not checked'}")]
        mfu = min(m, P)
        return [Part("gpu_below_peak", "compute below peak", P - mfu, "GPU idle and busy not split: utilization not read"),
                Part("mfu", "MFU", mfu, work.basis)]
    busy = min(util, P)
    if util > P + 0.005:
        notes.append(f"the GPUs were busy {fmt.pct(util)} of the time, more than the compute phases' "
                     f"{fmt.pct(P)}: work queued asynchronously ran during the host parts above, which keep that time")
    parts = [Part("gpu_idle", "GPU idle", P - busy, f"compute phases' time minus NVML utilization {fmt.pct(util)} "
                                                      f"of the ranks' GPUs")]
    if m is None:
        return parts + [Part("gpu_busy", "GPU busy (MFU not judged)", busy, work.why_not or "MFU not checked")]
    mfu = min(m, busy)
    if m > busy + 0.005:
        notes.append(f"MFU {fmt.pct(m)} is above the GPUs' busy share {fmt.pct(busy)}: the FLOPs formula counts more "
                     f"than the kernels did, or utilization under-reads; MFU capped at the busy share here")
    return parts + [Part("gpu_below_peak", "GPU busy below peak", busy - mfu,
                         "busy time not turned into model FLOPs at the dense peak"),
                    Part("mfu", "MFU", mfu, work.basis)]


def _rate(x: float | None, unit: str) -> str:
    return "-" if x is None else f"{x:.4g} {unit}"


def summary(w: Window | None) -> dict:
    """The job's work and account as plain data for the report, the run summary and `diagnose`
    ({} without a window or ranks): per rank and for the job, achieved TFLOP/s, tokens/s and MFU (or why
    not), MFU beside tensor activity, and the parts of the wall time."""
    if w is None or not w.ranks:
        return {}
    work = job_work(w)
    acc = account(w, work)
    ranks = [{"rank": x.rank, "host": x.host, "gpu": x.gpu or "-", "model": x.model or "-", "dtype": x.dtype or "-",
              "tflops": tflops(x.flops_per_s), "tokens": _rate(x.tokens_per_s, "tokens/s"),
              "flops_per_s": x.flops_per_s, "tokens_per_s": x.tokens_per_s, "peak_flops_per_s": x.peak,
              "mfu_value": x.mfu, "mfu": mfu_pct(x.mfu) if x.mfu is not None else x.why_not} for x in work.ranks]
    per = "GPU" if any(x.gpu for x in work.ranks) else "rank"   # a CPU job's rate is per rank, and says so
    job = {"achieved": f"{tflops(work.flops_per_s_per_gpu)} per {per}", "tokens": _rate(work.tokens_per_s, "tokens/s"),
           "flops_per_s_per_gpu": work.flops_per_s_per_gpu, "tokens_per_s": work.tokens_per_s,
           "mfu_value": work.mfu, "mfu": mfu_pct(work.mfu) if work.mfu is not None else work.why_not,
           "basis": work.basis, "tensor": work.beside_tensor()}
    return {"ranks": ranks, "job": job, "account": acc.as_dict(), "lines": acc.lines()}


def headline(job: dict) -> str:
    """One line of a `summary`'s job part: what is known of achieved FLOP/s and tokens/s, then MFU (beside
    tensor activity where read) or why it is not checked."""
    rates = [job["achieved"] if job["flops_per_s_per_gpu"] is not None else "",
             job["tokens"] if job["tokens_per_s"] is not None else ""]
    return ", ".join([r for r in rates if r] + [job["tensor"] or f"MFU {job['mfu']}"])


__all__ = ["Account", "Part", "account", "headline", "summary"]
