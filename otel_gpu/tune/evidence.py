"""A trial's evidence: the node's readings over its steady window, and its collective time per step.

One dict per trial (kept in the study, so any node can write the report):
- numbers under the keys of `COLUMNS` (SI units: fractions 0..1, bytes, bytes/s, seconds),
- `collectives`: {kind: seconds per optimizer step}, mean over ranks (sum of their collective time
  over the sum of their steps in the window), `collective_basis`: "host" (gloo: the rank's thread
  blocked) or "gpu" (NCCL kernels' time from the Flight Recorder),
- `window_s`: the steady window's length, `not_checked`: {key: why} for every key without a number.

Read from the trial's recording (`from_recording`) or from Prometheus (`from_prometheus`): the same
definitions in both. Gauges: the samples in the window (PromQL avg_over_time/max_over_time over a
window of exactly its length, in ms). Collective time per step: each rank's counters at the window's
end less their value at or before its start (a series born inside the window counts from 0), in PromQL
`x - x offset <window>` at the end, so both paths count the same steps and the same collective time.
Byte counters: the mean rate between their samples in the window (PromQL `rate`, which estimates it).
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import names as N

# key, header, scale, format, basis (what the number is)
COLUMNS = (
    ("sm_activity", "SM activity", 100, "{:.0f}%", "GPM SM activity, mean over GPUs and the window"),
    ("tensor_activity", "tensor activity", 100, "{:.0f}%", "GPM tensor-pipe activity, mean over GPUs and the window"),
    ("gpu_utilization", "GPU util", 100, "{:.0f}%", "NVML utilization (a kernel running), mean over GPUs and the window"),
    ("gpu_memory_peak_bytes", "GPU mem peak GiB", 1 / 2**30, "{:.2f}", "NVML memory used, peak over GPUs and the window"),
    ("nvlink_bytes_per_s", "NVLink GiB/s", 1 / 2**30, "{:.2f}", "NVLink bytes, tx+rx, summed over GPUs"),
    ("pcie_bytes_per_s", "PCIe GiB/s", 1 / 2**30, "{:.2f}", "PCIe bytes, tx+rx, summed over GPUs"),
    ("ib_bytes_per_s", "IB GiB/s", 1 / 2**30, "{:.2f}", "InfiniBand port bytes, tx+rx, summed over ports"),
    ("nic_bytes_per_s", "NIC MiB/s", 1 / 2**20, "{:.2f}", "Ethernet bytes, tx+rx, summed over physical interfaces"),
    ("cpu_busy", "CPU busy", 100, "{:.0f}%", "host CPU time not idle, mean over the window"),
    ("tokens_per_s", "tokens/s", 1, "{:.4g}", "tokens the ranks counted in the window, over its seconds"),
    ("tflops_per_gpu", "TFLOP/s per GPU", 1, "{:.3g}", "model FLOPs the ranks counted in the window, over its "
     "seconds and the GPUs they use (TFLOP/s)"),
    ("joules_per_step", "J/step", 1, "{:.4g}", "NVML energy of the ranks' GPUs per step, between energy reads in the window"),
    ("joules_per_token", "J/token", 1, "{:.4g}", "NVML energy of the ranks' GPUs over the tokens counted, same interval"),
)
MEMORY_KEY = "gpu_memory_peak_bytes"
GPU_KEYS = ("sm_activity", "tensor_activity", "gpu_utilization", MEMORY_KEY, "nvlink_bytes_per_s", "pcie_bytes_per_s")
COLLECTIVES, BASIS, NOT_CHECKED, WINDOW = "collectives", "collective_basis", "not_checked", "window_s"
OUTSIDE_STEPS = ("checkpoint", "eval")     # collective time in these phases is not step time
VIRTUAL = re.compile(r"^(|lo|docker.*|veth.*|virbr.*|br-.*|cni.*|flannel.*)$")
NO_AGENT = "no node agent readings in the window"
SOURCES = {   # evidence key -> the metrics it is read from (to tell 'not in this window' from 'never')
    "sm_activity": (N.GPU_SM_ACTIVITY,), "tensor_activity": (N.GPU_TENSOR_ACTIVITY,),
    "gpu_utilization": (N.GPU_UTILIZATION,), "gpu_memory_peak_bytes": (N.GPU_MEMORY_USAGE,),
    "nvlink_bytes_per_s": (N.GPU_NVLINK_IO, N.GPU_NVLINK_RATE), "pcie_bytes_per_s": (N.GPU_PCIE_RATE, N.GPU_PCIE_IO),
    "ib_bytes_per_s": (N.IB_IO,), "nic_bytes_per_s": (N.NET_IO,), "cpu_busy": (N.CPU_UTILIZATION,),
}
AGENT_LOG = "agent.log"


def numbers(evidence: Mapping[str, Any]) -> dict[str, float]:
    """The COLUMNS values that were measured."""
    return {k: float(evidence[k]) for k, *_ in COLUMNS if isinstance(evidence.get(k), (int, float))}


def why_not(evidence: Mapping[str, Any], key: str) -> str:
    """Why `key` has no number ('' when it has one or no reason was kept)."""
    return str((evidence.get(NOT_CHECKED) or {}).get(key, ""))


# ---- from a recording ----------------------------------------------------------------------------

def from_recording(rec, t0: float, t1: float, agent_note: str | None = None) -> dict[str, Any]:
    """Evidence over [t0, t1] (unix s) from an open `Recording`; `agent_note`: the node agent's own
    line about its GPUs (from its log), used as the reason when there are none."""
    def summaries(spec, keep: Callable = lambda s: True):
        return [(s, st) for s, st in rec.summaries(spec.name, t0, t1) if keep(s)]

    def mean_of(spec):
        vals = [st.mean for _, st in summaries(spec) if st.n and _finite(st.mean)]
        return sum(vals) / len(vals) if vals else None

    def rate_sum(spec, keep: Callable = lambda s: True):
        rates = [st.rate for _, st in summaries(spec, keep) if st.rate is not None and _finite(st.rate)]
        return sum(max(0.0, r) for r in rates) if rates else None

    def gauge_sum(spec):   # a per-GPU, per-direction rate gauge: sum of the means
        vals = [st.mean for _, st in summaries(spec) if st.n and _finite(st.mean)]
        return sum(vals) if vals else None

    peaks = [st.max for _, st in summaries(N.GPU_MEMORY_USAGE) if _finite(st.max)]
    idle = [st.mean for _, st in summaries(N.CPU_UTILIZATION, lambda s: s.get(N.CPU_MODE) == "idle") if st.n]
    out: dict[str, Any] = {
        "sm_activity": mean_of(N.GPU_SM_ACTIVITY), "tensor_activity": mean_of(N.GPU_TENSOR_ACTIVITY),
        "gpu_utilization": mean_of(N.GPU_UTILIZATION), MEMORY_KEY: max(peaks) if peaks else None,
        "nvlink_bytes_per_s": _first(rate_sum(N.GPU_NVLINK_IO), gauge_sum(N.GPU_NVLINK_RATE)),
        "pcie_bytes_per_s": _first(gauge_sum(N.GPU_PCIE_RATE), rate_sum(N.GPU_PCIE_IO)),
        "ib_bytes_per_s": rate_sum(N.IB_IO),
        "nic_bytes_per_s": rate_sum(N.NET_IO, lambda s: not VIRTUAL.match(s.get(N.IFACE))),
        "cpu_busy": 1.0 - sum(idle) / len(idle) if idle else None,
        WINDOW: t1 - t0,
    }
    out.update(_collectives_recorded(rec, t0, t1))
    from .work_evidence import from_recording as work_of   # tokens, FLOPs and energy (imports this module)
    work = work_of(rec, t0, t1)
    seen = {
        "agent": any(rec.summaries(spec.name, t0, t1) for spec in (N.CPU_UTILIZATION, N.SAMPLES, N.MEMORY_USAGE)),
        "gpu": bool(rec.summaries(N.GPU_UTILIZATION.name, t0, t1) or rec.summaries(N.GPU_MEMORY_USAGE.name, t0, t1)),
        "ib_port": bool(rec.summaries(N.IB_UP.name) or rec.summaries(N.IB_IO.name)),
        "recorded": {key for key, specs in SOURCES.items() if any(
            not (key == "nic_bytes_per_s" and VIRTUAL.match(s.get(N.IFACE)))
            for spec in specs for s, _ in rec.summaries(spec.name))},
        "unmeasured": sorted({s.get(N.UNMEASURED_REASON) for s, st in rec.summaries(N.TRAIN_COLLECTIVE_UNMEASURED.name, t0, t1)
                              if st.last}),
    }
    out[NOT_CHECKED] = reasons(out, seen, agent_note)
    return _with_work(out, work)


def _with_work(out: dict[str, Any], work: dict[str, Any]) -> dict[str, Any]:
    """`out` with the work and energy numbers and their own reasons (work_evidence.py)."""
    why = work.pop(NOT_CHECKED)
    out.update(work)
    out[NOT_CHECKED] = {**{k: v for k, v in out[NOT_CHECKED].items() if k not in work}, **why}
    return out


def increase(points, t0: float, t1: float) -> float | None:
    """A cumulative series' increase over (t0, t1]: its last value at or before t1 less its last value at
    or before t0 (0 when it was born after t0); None without a point in the window (pure)."""
    before = [v for t, v in points if t <= t0]
    inside = [v for t, v in points if t0 < t <= t1]
    if not inside:
        return None
    return max(0.0, inside[-1] - (before[-1] if before else 0.0))


def _collectives_recorded(rec, t0: float, t1: float) -> dict[str, Any]:
    """Collective seconds per step by kind: sum over ranks of the counter's increase in the window
    over the sum of their steps in it (the step-duration histogram's count), both from each rank's
    value at or before the window's start."""
    steps = 0.0
    for s in rec.series(N.TRAIN_STEP_DURATION.name, None, t1):
        steps += increase([(t, c) for (t, _), c in zip(s.points, s.counts)], t0, t1) or 0.0
    by_kind: dict[str, float] = defaultdict(float)
    bases = set()
    for s in rec.series(N.TRAIN_COLLECTIVE_TIME.name, None, t1):
        if s.get(N.PHASE) in OUTSIDE_STEPS:
            continue
        grew = increase(s.points, t0, t1)
        if grew is not None:
            by_kind[s.get(N.COLLECTIVE) or "?"] += grew
            bases.add(s.get(N.COLLECTIVE_BASIS))
    return _per_step(by_kind, steps, bases)


def _per_step(by_kind: Mapping[str, float], steps: float, bases: set) -> dict[str, Any]:
    ran = {k: v for k, v in by_kind.items() if v > 0}     # kinds that ran in the window (not only at start-up)
    if not ran or steps <= 0:
        return {COLLECTIVES: None, BASIS: None}
    return {COLLECTIVES: {k: v / steps for k, v in sorted(ran.items())},
            BASIS: "+".join(sorted(b for b in bases if b)) or None}


def reasons(ev: Mapping[str, Any], seen: Mapping[str, Any], agent_note: str | None) -> dict[str, str]:
    """{key: why it has no number} for every missing one (pure)."""
    out: dict[str, str] = {}
    for key, *_ in COLUMNS:
        if ev.get(key) is not None:
            continue
        if key in (seen.get("recorded") or ()):
            window = ev.get(WINDOW)
            out[key] = ("not checked: too few readings inside the "
                        + (f"{window:.1f} s " if isinstance(window, (int, float)) else "")
                        + "steady window (the node agent reads once a second by default)")
        elif not seen.get("agent") and not seen.get("gpu"):
            out[key] = f"not checked: {NO_AGENT}"
        elif key in GPU_KEYS and not seen.get("gpu"):
            out[key] = "not checked: no GPU" + (f" ({agent_note})" if agent_note else " readings on this node")
        elif key in ("sm_activity", "tensor_activity"):
            out[key] = "not checked: no GPM readings (NVIDIA Hopper or newer, not MIG)"
        elif key == "nvlink_bytes_per_s":
            out[key] = "not checked: no NVLink readings (this GPU has no NVLink, or NVML does not report it)"
        elif key == "pcie_bytes_per_s":
            out[key] = "not checked: no PCIe readings from NVML/GPM"
        elif key == "ib_bytes_per_s":
            out[key] = ("not checked: no InfiniBand port on this node" if not seen.get("ib_port")
                        else "not checked: under two InfiniBand readings in the window")
        elif key == "nic_bytes_per_s" and seen.get("agent"):
            out[key] = "not checked: no physical network interface read on this node"
        else:
            out[key] = "not checked: too few readings in the window" if seen.get("agent") else f"not checked: {NO_AGENT}"
    if ev.get(COLLECTIVES) is None:
        lost = ", ".join(seen.get("unmeasured") or ())
        out[COLLECTIVES] = ("not measured: " + lost) if lost else \
            "not measured: no collective timed in the steady window (no torch.distributed, or not instrumented)"
    return out


def agent_note(directory: Path) -> str | None:
    """The node agent's line about its GPUs, from the agent.log in `directory` (None: none)."""
    try:
        text = (directory / AGENT_LOG).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if "GPU" in line or "NVML" in line or "nvidia" in line.lower():
            return " ".join(line.replace("otel-gpu agent:", "").split())[:160]
    return None


# ---- from Prometheus ------------------------------------------------------------------------------

def _p(spec) -> str:
    return spec.prometheus_name()


# {sel} is replaced by the node selector, {w} by the window (ms); {trial} by the trial's selector
PROM = {
    "sm_activity": f"avg(avg_over_time({_p(N.GPU_SM_ACTIVITY)}{{sel}}[{{w}}]))",
    "tensor_activity": f"avg(avg_over_time({_p(N.GPU_TENSOR_ACTIVITY)}{{sel}}[{{w}}]))",
    "gpu_utilization": f"avg(avg_over_time({_p(N.GPU_UTILIZATION)}{{sel}}[{{w}}]))",
    MEMORY_KEY: f"max(max_over_time({_p(N.GPU_MEMORY_USAGE)}{{sel}}[{{w}}]))",
    "nvlink_bytes_per_s": f"sum(rate({_p(N.GPU_NVLINK_IO)}{{sel}}[{{w}}])) or sum(avg_over_time({_p(N.GPU_NVLINK_RATE)}{{sel}}[{{w}}]))",
    "pcie_bytes_per_s": f"sum(avg_over_time({_p(N.GPU_PCIE_RATE)}{{sel}}[{{w}}])) or sum(rate({_p(N.GPU_PCIE_IO)}{{sel}}[{{w}}]))",
    "ib_bytes_per_s": f"sum(rate({_p(N.IB_IO)}{{sel}}[{{w}}]))",
    "nic_bytes_per_s": f"sum(rate({_p(N.NET_IO)}{{sel_nic}}[{{w}}]))",
    "cpu_busy": f"1 - avg(avg_over_time({_p(N.CPU_UTILIZATION)}{{sel_idle}}[{{w}}]))",
}
_COLL = _p(N.TRAIN_COLLECTIVE_TIME)
_STEPS = _p(N.TRAIN_STEP_DURATION) + "_count"
# per rank and kind: the counter at the window's end less its value at or before the start (or all of it,
# for a series born inside the window); over the ranks' steps counted the same way
COLLECTIVE_QUERY = (f"sum by ({N.COLLECTIVE.replace('.', '_')}, {N.COLLECTIVE_BASIS.replace('.', '_')}) "
                    f"(({_COLL}{{trial_coll}} - {_COLL}{{trial_coll}} offset {{w}}) or {_COLL}{{trial_coll}}) "
                    f"/ scalar(sum({_STEPS}{{trial}} - {_STEPS}{{trial}} offset {{w}}))")
# series that tell why a number is missing
PROM_SEEN = {
    "agent": f"count(count_over_time({_p(N.CPU_UTILIZATION)}{{sel}}[{{w}}]))",
    "gpu": f"count(count_over_time({_p(N.GPU_MEMORY_USAGE)}{{sel}}[{{w}}]))",
    "ib_port": f"count(count_over_time({_p(N.IB_UP)}{{sel}}[{{w}}]))",
}


def _selector(base: str, *extra: str) -> str:
    parts = [p for p in [base.strip().strip("{}").strip(), *extra] if p]
    return "{" + ",".join(parts) + "}" if parts else ""


def prom_render(template: str, node_selector: str, trial_selector: str, window: str) -> str:
    """A query with its placeholders filled in (pure)."""
    idle = f'{N.CPU_MODE.replace(".", "_")}="idle"'
    nic = f'{N.IFACE.replace(".", "_")}!~"{VIRTUAL.pattern}"'
    phase = f'{N.PHASE.replace(".", "_")}!~"{"|".join(OUTSIDE_STEPS)}"'
    return (template.replace("{sel_idle}", _selector(node_selector, idle)).replace("{sel_nic}", _selector(node_selector, nic))
            .replace("{trial_coll}", _selector(trial_selector, phase)).replace("{trial}", _selector(trial_selector))
            .replace("{sel}", _selector(node_selector)).replace("{w}", window))


def window_ms(t0: float, t1: float) -> str:
    """The PromQL range of [t0, t1] to the millisecond (Prometheus keeps ms timestamps), at least 1 ms."""
    return f"{max(1, round((t1 - t0) * 1000))}ms"


def from_prometheus(query: Callable[[str, float], list], node_selector: str, trial_selector: str,
                    t0: float, t1: float) -> dict[str, Any]:
    """Evidence over [t0, t1] from PromQL; `query(promql, at)` returns the instant vector's samples
    (objects with `.value` and `.labels`)."""
    w = window_ms(t0, t1)

    def scalar(template: str) -> float | None:
        result = query(prom_render(template, node_selector, trial_selector, w), t1)
        value = result[0].value if result else None
        return value if value is not None and _finite(value) else None

    out: dict[str, Any] = {key: scalar(q) for key, q in PROM.items()}
    out[WINDOW] = t1 - t0
    by_kind, bases = {}, set()
    for sample in query(prom_render(COLLECTIVE_QUERY, node_selector, trial_selector, w), t1):
        if sample.value is not None and _finite(sample.value) and sample.value > 0:
            kind = sample.labels.get(N.COLLECTIVE.replace(".", "_"), "?")
            by_kind[kind] = by_kind.get(kind, 0.0) + max(0.0, sample.value)
            bases.add(sample.labels.get(N.COLLECTIVE_BASIS.replace(".", "_"), ""))
    out[COLLECTIVES] = dict(sorted(by_kind.items())) or None
    out[BASIS] = ("+".join(sorted(b for b in bases if b)) or None) if by_kind else None
    seen = {k: bool(scalar(q)) for k, q in PROM_SEEN.items()}
    out[NOT_CHECKED] = reasons(out, seen, None)
    from .work_evidence import from_prometheus as work_of   # tokens, FLOPs and energy (imports this module)
    return _with_work(out, work_of(query, node_selector.strip().strip("{}"), trial_selector, t0, t1, w))


def _first(*values):
    return next((v for v in values if v is not None), None)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
