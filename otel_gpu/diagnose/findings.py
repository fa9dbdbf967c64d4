"""What a rule reports: one `Finding` per bottleneck seen, ranked by the time at stake.

Time at stake is in GPU-seconds: the estimated time the job's GPUs (or, for training-side
rules, its ranks: one rank drives one GPU) lost to the bottleneck over the window. It is an
estimate, and every finding says its basis.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("critical", "warning", "info")
CONFIDENCES = ("high", "medium", "low")


@dataclass
class Finding:
    """One diagnosis: what was seen, why it matters, how sure, what to do next."""

    rule: str                    # rule id, e.g. "checkpoint"
    title: str                   # one line
    severity: str                # "critical" | "warning" | "info"
    confidence: str              # "high" | "medium" | "low"; "" when not checked (`missing`)
    seen: str                    # the observation, with its numbers
    why: str                     # why it matters: the estimate and its basis
    action: str                  # a concrete next step
    lost_s: float = 0.0          # GPU-seconds at stake (estimate; 0 when not estimable)
    lost_share: float | None = None  # share of the job's GPU (or rank) time lost, 0..1
    basis: str = ""              # how lost_s / lost_share were estimated
    where: dict[str, list[str]] = field(default_factory=dict)  # nodes / gpus / ranks
    ranges: list[tuple[float, float]] = field(default_factory=list)  # unix seconds
    evidence: dict[str, Any] = field(default_factory=dict)  # the numbers behind it
    tune_space: dict[str, Any] | None = None   # suggested `otel-gpu tune` space (ZeRO findings)
    missing: list[str] = field(default_factory=list)  # inputs that were missing

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} not in {SEVERITIES}")
        if self.missing:
            self.confidence = ""   # a rule that could not run is sure of nothing
        elif self.confidence not in CONFIDENCES:
            raise ValueError(f"confidence {self.confidence!r} not in {CONFIDENCES}")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranges"] = [list(r) for r in self.ranges]
        return d


def missing_input(rule: str, what: str, needs: str, missing: list[str]) -> Finding:
    """The finding of a rule that cannot run: says what is missing instead of guessing."""
    return Finding(
        rule=rule,
        title=f"{what}: not checked (no {', '.join(missing)})",
        severity="info",
        confidence="",
        seen=f"no {', '.join(missing)} in the window",
        why="this rule needs that input; without it the bottleneck can be neither confirmed nor ruled out",
        action=needs,
        missing=list(missing),
    )


def severity_for(share: float | None, warning: float, critical: float) -> str:
    """Severity from the share of time lost: >= critical, >= warning, else info."""
    if share is None:
        return "info"
    if share >= critical:
        return "critical"
    if share >= warning:
        return "warning"
    return "info"


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Most time at stake first; among equals (e.g. risks with no time estimate) the more severe;
    missing-input notes last."""
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (bool(f.missing), -f.lost_s, order[f.severity], f.rule))


def worst_severity(findings: list[Finding]) -> str | None:
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return min((f.severity for f in findings), key=order.__getitem__, default=None)
