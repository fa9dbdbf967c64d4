"""Periodic stalls: job-wide activity drops at a regular interval, matched to a phase where one fits."""
from __future__ import annotations

from . import fmt
from . import timeseries as ts
from .findings import Finding, severity_for
from .thresholds import Thresholds
from .model import Window

CAUSES = {
    "checkpoint": ("checkpoints", "the time is counted in the checkpoint finding: save asynchronously or less often"),
    "eval": ("evaluation", "evaluate less often, on a subset, or asynchronously"),
    "data_wait": ("data-loading bursts (epoch boundaries or loader refills)",
                  "DataLoader(persistent_workers=True), a larger prefetch_factor"),
}


def periodic_stalls(w: Window, th: Thresholds) -> list[Finding]:
    t, sev = th["periodic"], th["severity"]
    sig = ts.activity(w)
    if sig is None:
        return []
    what, values = sig
    med = ts.median(values)
    if not med or med <= 0:
        return []
    drops = ts.events(w.timeline.t, ts.below(values, t["drop_fraction"] * med), values, w.step_s)
    if len(drops) < t["min_events"]:
        return []
    per = ts.period(drops)
    if per is None or per[1] > t["period_cv_max"]:
        return []
    every, cv = per
    matched, best, inside = _match(w, drops, t["match_share"])
    key = {"GPU SM activity": "sm", "GPU utilization": "util"}.get(what)
    units = (sum(getattr(g, key) is not None for g in w.gpus) if key else 0) or max(len(w.ranks), 1)
    stalled = sum(e.duration_s * max(0.0, 1 - e.level / med) for e in drops) * units
    share = stalled / (w.gpu_time_s() or 1.0)
    cause, advice = CAUSES.get(matched, ("no phase the training reports", ""))
    counted_elsewhere = matched in ("checkpoint", "eval")
    return [Finding(
        rule="periodic",
        title=f"{what} stalls every {fmt.secs(every)}"
              + (f", matching {cause}" if matched else " (cause not in the training phases)"),
        severity="info" if counted_elsewhere else severity_for(share, sev["warning_share"], sev["critical_share"]),
        confidence="high" if cv < t["period_cv_max"] / 2 and len(drops) >= 4 else "medium",
        seen=f"{len(drops)} drops of {what} below {fmt.pct(t['drop_fraction'], 0)} of its median "
             f"({fmt.pct(med) if what != 'step rate' else f'{med:.2f} steps/s'}), every {fmt.secs(every)} "
             f"(variation {fmt.pct(cv, 0)}), {fmt.secs(sum(e.duration_s for e in drops) / len(drops))} each"
             + (f"; {fmt.pct(best, 0)} of them inside the {matched} phase" if matched else ""),
        why=f"about {fmt.gpu_time(stalled, w.unit)} ({fmt.pct(share)} of {w.unit} time) lost in the stalls",
        action=advice if matched else ("line the stall times up with the job's logs: garbage collection "
                                       "(gc.freeze() after setup), logging or metric flushes, a periodic host job, "
                                       "a collective timeout; `otel-gpu trace analyze` on a trace that spans one"),
        lost_s=0.0 if counted_elsewhere else stalled, lost_share=share,
        basis="drop durations x depth below the median x GPUs (or ranks)"
              + ("; not counted here (see the matching phase's finding)" if counted_elsewhere else ""),
        ranges=[(e.start, e.end) for e in drops],
        evidence={"period_s": round(every, 3), "cv": round(cv, 4), "drops": len(drops), "signal": what,
                  "median": med, "matched_phase": matched, "match_share": round(best, 3),
                  "drop_time_in_phase": round(inside, 3), "stall_gpu_s": stalled},
    )]


def _match(w: Window, drops: list, min_share: float) -> tuple[str | None, float, float]:
    """(the phase the drops belong to or None, the share of drops touching it, the share of the
    drops' time inside it). A phase qualifies when at least ``min_share`` of the drops touch it (a
    step of slack each side); of those, the one the drops spend most time in wins. Touching alone
    would let a phase seen at every drop's edge (the loader refilling after a checkpoint) outvote the
    phase the drops are made of when a window cuts the first drop short."""
    best: tuple[float, float, str] | None = None
    top_touch = 0.0
    for phase in CAUSES:
        mask = ts.phase_mask(w.timeline, phase, 0.01)
        if not any(mask):
            continue
        touch = sum(ts.overlaps(e, w.timeline.t, mask, w.step_s) for e in drops) / len(drops)
        top_touch = max(top_touch, touch)
        if touch >= min_share:
            cand = (ts.share_inside(drops, w.timeline.t, mask), touch, phase)
            if best is None or cand[:2] > best[:2]:
                best = cand
    if best is None:
        return None, top_touch, 0.0
    return best[2], best[1], best[0]
