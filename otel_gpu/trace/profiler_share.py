"""How much of a captured step the profiler itself may have added, for every launch-bound verdict.

Recording a trace slows the CPU side (each op and launch is logged), so launch gaps in a trace are
wider than in the same job unprofiled. Given the median step time of the same job's unprofiled steps
(us, measured around the capture), the profiler's possible share is (captured - unprofiled) / captured
of the median captured step (the trace's ``ProfilerStep`` windows). Without unprofiled steps, or
without steps in the trace, the share is "not checked" with the reason.
"""
from __future__ import annotations

import math

import numpy as np

NOT_GIVEN = "profiler overhead not checked: no unprofiled steps to compare"


def profiler_share(windows: list, unprofiled_step_us: float | None) -> dict:
    """``{"checked", "text"}`` plus, when checked, ``captured_step_us``, ``unprofiled_step_us`` and
    ``profiler_share_pct`` (0 when the unprofiled steps were not faster). ``windows``: (step, start
    us, end us) of the captured steps; ``unprofiled_step_us``: median unprofiled step time (us), None
    when none were measured, NaN when none were measured for this rank."""
    if unprofiled_step_us is None:
        return {"checked": False, "text": NOT_GIVEN}
    if not math.isfinite(unprofiled_step_us) or unprofiled_step_us <= 0:
        return {"checked": False, "text": "profiler overhead not checked: no unprofiled step time for this rank"}
    steps = [b - a for _, a, b in windows if b > a]
    if not steps:
        return {"checked": False, "text": "profiler overhead not checked: no ProfilerStep in the trace to time"}
    captured = float(np.median(steps))
    share = max(0.0, 100.0 * (captured - unprofiled_step_us) / captured)
    text = (f"captured steps {captured / 1e3:,.2f} ms against {unprofiled_step_us / 1e3:,.2f} ms unprofiled: "
            f"the profiler may account for up to {share:.0f}% of each step")
    return {"checked": True, "text": text, "captured_step_us": round(captured, 1),
            "unprofiled_step_us": round(float(unprofiled_step_us), 1), "profiler_share_pct": round(share, 1)}
