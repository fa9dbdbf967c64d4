"""The alert table of docs/deploy.md, from the same thresholds and parameters as the rules (pure;
tests/alerts/test_rules.py keeps the page and this in step): `python -m otel_gpu.alerts.doc`."""
from __future__ import annotations

from ..diagnose.thresholds import Thresholds
from .params import RuleParams, duration
from .rules import stall_numbers


def _pct(x: float) -> str:
    return f"{x * 100:g}%"


def rows(th: Thresholds, p: RuleParams) -> list[tuple[str, str, str, str, str]]:
    """(alert, severity, fires when, window, for) per alert."""
    k, floor = stall_numbers(th)
    s, st, sev = th["stall"], th["straggler"], th["severity"]
    f = {name: duration(v) for name, v in p.for_s.items()}
    w, pw, gw, ew = (duration(x) for x in (p.window_s, p.periodic_window_s, p.gpu_window_s, p.error_window_s))
    return [
        ("OtelGpuTrainingStalled", "critical",
         f"no rank completed a step for max({k:g} x the job's median step, {floor:g} s) while its ranks still report "
         f"(newest sample younger than {duration(p.fresh_s)}), unless every rank spent {_pct(s['outside_share'])} of "
         "the last minute in checkpoint or eval; names the holding rank(s): not inside a host-timed collective while "
         f"another has waited in one {_pct(s['wait_share'])} of the stall, behind the others' NCCL sequence number, or "
         "gone", "1m (outside share)", f["OtelGpuTrainingStalled"]),
        ("OtelGpuStraggler", f"warning; critical from {_pct(max(st['lateness_share'], sev['critical_share']))}",
         f"the busiest rank's busy time per step (step time minus collective waits and checkpoint time) exceeds the "
         f"mean of the job's other ranks (same collective basis) by {_pct(max(st['lateness_share'], sev['warning_share']))} "
         f"of the job's mean step and {st['lateness_min_s'] * 1000:g} ms, with 3 steps in the window", w,
         f["OtelGpuStraggler"]),
        ("OtelGpuInputBound", f"warning; critical from {_pct(th['input']['share_critical'])}",
         f"every rank of the job waits for its next batch (data_wait) at least {_pct(th['input']['share_warning'])} of "
         "its wall time", w, f["OtelGpuInputBound"]),
        ("OtelGpuCheckpointShare", f"warning; critical from {_pct(th['checkpoint']['share_critical'])}",
         f"a rank spends at least {_pct(th['checkpoint']['share_warning'])} of its wall time saving checkpoints "
         "(own time and waits inside)", pw, f["OtelGpuCheckpointShare"]),
        ("OtelGpuEvalShare", f"warning; critical from {_pct(th['eval']['share_critical'])}",
         f"a rank spends at least {_pct(th['eval']['share_warning'])} of its wall time evaluating", pw,
         f["OtelGpuEvalShare"]),
        ("OtelGpuHardwareErrors", "XID warning, uncorrected ECC critical, corrected ECC info",
         "a GPU's XID count (a new XID series counts) or volatile ECC count grew", ew, f["OtelGpuHardwareErrors"]),
        ("OtelGpuRowRemap", "pending warning, failed critical",
         "a GPU reports a memory row remap pending (applied at the next reset) or failed (the GPU needs service)",
         "the agent's flag (read every 10 s)", f["OtelGpuRowRemap"]),
        ("OtelGpuThrottledWhileTraining", "thermal / HW slowdown / power brake warning; power cap info",
         f"a clock-event reason active at least {_pct(th['throttle']['share_min'])} of the window on a GPU of a node "
         "whose ranks complete steps", gw, f["OtelGpuThrottledWhileTraining"]),
        ("OtelGpuIdleWhileTraining", "warning",
         f"a GPU holding a rank's memory has mean utilization below {_pct(th['gpu_idle']['util_max'])} while that "
         "rank completes steps", gw, f["OtelGpuIdleWhileTraining"]),
        ("OtelGpuRankMissing", "critical",
         f"a rank's newest sample is {duration(s['gone_s'])} older than its job's newest while the job still reports",
         f"seen within {duration(p.lookback_s)}", f["OtelGpuRankMissing"]),
        ("OtelGpuAgentMissing", "warning",
         f"a node agent exported within {duration(p.lookback_s)} but not within {duration(p.fresh_s)}, or its scrape "
         f"target (job `{p.agent_scrape_job}`) is down", f"seen within {duration(p.lookback_s)}",
         f["OtelGpuAgentMissing"]),
        ("OtelGpuCollectivesUnmeasured", "info",
         "a rank's collectives were not timed (ring overflows or timing off counted in the window, or a whole "
         "process without a Flight Recorder): the straggler alert is blind to it", w,
         f["OtelGpuCollectivesUnmeasured"]),
    ]


def markdown_table(th: Thresholds | None = None, p: RuleParams | None = None) -> str:
    th, p = th or Thresholds(), p or RuleParams()
    out = ["| alert | severity | fires when | window | `for:` |", "|---|---|---|---|---|"]
    out += [f"| `{a}` | {s} | {w} | {win} | {f} |" for a, s, w, win, f in rows(th, p)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
