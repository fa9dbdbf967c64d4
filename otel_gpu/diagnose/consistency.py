"""Are the job's GPUs alike? A collective runs at its slowest member's speed, so one GPU of another
model, with less memory, a lower maximum SM clock, or on a PCIe link of a lower generation or fewer
lanes holds every rank back; GPUs under different driver versions run different CUDA and NCCL paths.

Pure: the window's GPUs (model, memory size, the highest PCIe generation and width each reached in the
window: links are lowered while idle; the maximum SM clock; the driver version) in, one finding per
property that differs, naming the odd GPUs against the value most of them share. A property no two GPUs
report is not compared.
"""
from __future__ import annotations

from collections import Counter

from .findings import Finding
from .model import GpuStats, Window
from .thresholds import Thresholds

GIB = 2**30
PROPERTIES = ("model", "memory (GiB)", "PCIe generation", "PCIe width (lanes)", "max SM clock (MHz)", "driver")


def _props(g: GpuStats) -> dict[str, object]:
    mem = round(g.mem_limit_b / GIB, 1) if g.mem_limit_b else None   # GiB: drivers report a few MiB apart
    return {"model": g.model or None, "memory (GiB)": mem,
            "PCIe generation": int(g.pcie_gen) if g.pcie_gen else None,
            "PCIe width (lanes)": int(g.pcie_width) if g.pcie_width else None,
            "max SM clock (MHz)": round(g.sm_clock_limit_hz / 1e6) if g.sm_clock_limit_hz else None,
            "driver": g.driver or None}


def common_value(values: list) -> object:
    """The value most GPUs share; among equally common numbers the largest (the slower ones are odd), among
    equally common texts the first in order."""
    counts = Counter(values)
    top = max(counts.values())
    tied = [v for v, n in counts.items() if n == top]
    return max(tied) if all(isinstance(v, (int, float)) for v in tied) else sorted(tied, key=str)[0]


def odd_gpus(gpus: list[GpuStats]) -> dict[str, tuple[object, dict[str, object]]]:
    """property -> (the common value, {GPU name: its other value}) for every property that differs."""
    out = {}
    props = [(g.name, _props(g)) for g in gpus]
    for key in PROPERTIES:
        known = [(name, p[key]) for name, p in props if p[key] is not None]
        if len(known) < 2 or len({v for _, v in known}) == 1:
            continue
        common = common_value([v for _, v in known])
        out[key] = (common, {name: v for name, v in known if v != common})
    return out


WHY = {None: "collectives and synchronous steps run at the slowest GPU's speed, so one unlike GPU sets the pace "
             "of every rank (time at stake not estimated)",
       "driver": "ranks under different drivers run different CUDA and NCCL code: speeds differ and NCCL may hang "
                 "or fail between them (time at stake not estimated)"}
ACTION = {None: "move the job off the odd GPUs (exclude their nodes) or, for a PCIe link below its maximum, reseat "
                "or check the slot and riser; `otel-gpu doctor` on that node lists the link's current and maximum "
                "generation and width and each GPU's model, memory, maximum SM clock and driver",
          "driver": "install the same driver on every node of the job, or exclude the odd nodes; `otel-gpu doctor` "
                    "on a node shows its driver version"}


def gpu_consistency(w: Window, th: Thresholds) -> list[Finding]:
    """One warning per property in which the job's GPUs differ, naming the odd ones."""
    findings = []
    for key, (common, odd) in odd_gpus(w.gpus).items():
        listed = ", ".join(f"{name} {v}" for name, v in sorted(odd.items()))
        findings.append(Finding(
            rule="gpu_consistency",
            title=f"GPUs of the job differ in {key}: {len(odd)} of {len(w.gpus)} not {common}",
            severity="warning", confidence="high",
            seen=f"{key}: most GPUs {common}; {listed}",
            why=WHY.get(key, WHY[None]),
            action=ACTION.get(key, ACTION[None]),
            basis="not estimated: the readings show the difference, not its cost",
            where={"gpus": sorted(odd)},
            evidence={"property": key, "common": common, "odd": dict(sorted(odd.items()))}))
    return findings


def unlike(groups: dict[str, list[GpuStats]]) -> list[dict]:
    """`doctor`: for each group of GPUs (a job's, or all of a node's), each property in which they differ,
    as table rows (group, property, the common value, the odd GPUs and theirs)."""
    rows = []
    for group, gpus in groups.items():
        for key, (common, odd) in odd_gpus(gpus).items():
            rows.append({"gpus": group, "property": key, "most": common,
                         "odd": ", ".join(f"{name} {v}" for name, v in sorted(odd.items()))})
    return rows
