"""Diagnosis: rules over a window of a job's metrics (and profiles) name the bottleneck, with evidence.

    from otel_gpu.diagnose import diagnose
    report = diagnose(PromClient(url), job="llama-z3", start=t0, end=t1)
    for f in report.findings: print(f.severity, f.title)

Each rule is a pure function `rule(window, thresholds) -> list[Finding]`; add one to `RULES`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .allocator import allocator
from .account import summary as work_summary
from .comm import comm_bound
from .consistency import gpu_consistency
from .findings import Finding, rank_findings, worst_severity
from .periodic import periodic_stalls
from .rules_gpu import memory_pressure, sm_idle, throttling
from .evaluation import evaluation
from .rules_train import checkpoint, epoch_boundaries, input_bound
from .stall import stall
from .straggler import straggler
from .tensor import tensor_idle
from .unphased import unphased_time
from .thresholds import Thresholds, load_thresholds
from .window import DiagnoseError, Window, fetch_window

Rule = Callable[[Window, Thresholds], list[Finding]]

RULES: list[Rule] = [sm_idle, comm_bound, checkpoint, input_bound, unphased_time, straggler, periodic_stalls,
                     evaluation, epoch_boundaries, throttling, memory_pressure, allocator, tensor_idle, stall, gpu_consistency]


def run_rules(w: Window, th: Thresholds | None = None, rules: list[Rule] | None = None) -> list[Finding]:
    """Every rule over the window, findings ranked by time at stake."""
    th = th or Thresholds()
    out: list[Finding] = []
    for rule in rules or RULES:
        out += rule(w, th)
    return rank_findings(out)


@dataclass
class Report:
    window: Window
    findings: list[Finding]
    queries: dict[str, Any] = field(default_factory=dict)   # PromClient stats
    seconds: float = 0.0                                      # wall time of the whole diagnosis

    def as_dict(self) -> dict[str, Any]:
        w = self.window
        return {
            "job": w.job, "start": w.start, "end": w.end, "duration_s": w.duration_s,
            "training_start": w.train_start, "training_end": w.train_end,
            "ranks": len(w.ranks), "gpus": len(w.gpus), "nodes": len(w.nodes),
            "timeline_step_s": w.step_s, "export_interval_s": w.interval_s, "notes": list(w.notes),
            "profiles": w.profile.source if w.profile is not None else None,
            "worst_severity": worst_severity(self.findings),
            "findings": [f.as_dict() for f in self.findings],
            "work": work_summary(w),   # TFLOP/s, tokens/s, MFU and where the time went (account.py)
            "queries": self.queries, "seconds": round(self.seconds, 4),
        }


def diagnose(client, job: str | None, start: float, end: float, *, thresholds: Thresholds | None = None,
             profile=None, profile_error: str | None = None, require_steps: bool = True) -> Report:
    """Fetch the window from `client` (a PromClient), add `profile` (a ProfileSummary) or why profiles could
    not be read (`profile_error`), run the rules."""
    t0 = time.perf_counter()
    w = fetch_window(client, job, start, end, require_steps=require_steps)
    w.profile, w.profile_error = profile, profile_error
    if profile_error:
        w.notes.append(f"profiles not checked: {profile_error}")
    findings = run_rules(w, thresholds)
    return Report(w, findings, client.stats.as_dict(), time.perf_counter() - t0)


__all__ = ["RULES", "DiagnoseError", "Finding", "Report", "Thresholds", "Window", "diagnose", "fetch_window",
           "load_thresholds", "run_rules"]
