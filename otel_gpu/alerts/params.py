"""What the rules need besides the thresholds: windows, freshness, `for:` durations (seconds).

The defaults suit jobs whose steps last from tens of milliseconds to about a minute (the seeds'
50 s steps): a rate window of 5 minutes holds at least 6 such steps; a periodic event (checkpoint,
eval) is judged over an hour. Every duration can be given for a test (`otel-gpu alerts --window 10s
--for 5s`), where the same rules must fire within a minute.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

# alert -> `for:` seconds by default: long enough that a clean job's seconds-long drift between ranks
# (ranks sharing CPUs) never holds for the whole of it; zero where one event is the news
FOR_DEFAULTS: dict[str, float] = {
    "OtelGpuTrainingStalled": 60.0,    # the condition itself already waits max(K x median step, T)
    "OtelGpuStraggler": 600.0,
    "OtelGpuInputBound": 900.0,
    "OtelGpuCheckpointShare": 900.0,
    "OtelGpuEvalShare": 1800.0,
    "OtelGpuHardwareErrors": 0.0,
    "OtelGpuRowRemap": 60.0,
    "OtelGpuThrottledWhileTraining": 600.0,
    "OtelGpuIdleWhileTraining": 600.0,
    "OtelGpuAgentMissing": 120.0,
    "OtelGpuRankMissing": 120.0,
    "OtelGpuCollectivesUnmeasured": 900.0,
}
MIN_STEPS = 3   # steps a rank must complete in the rate window before its step times are compared


@dataclass(frozen=True)
class RuleParams:
    window_s: float = 300.0             # rate window of the per-rank series (steps, busy time, data_wait)
    periodic_window_s: float = 3600.0   # checkpoint and eval shares: saves every N minutes need a long window
    gpu_window_s: float = 300.0         # GPU throttle and idle shares
    error_window_s: float = 900.0       # XID / ECC counts increasing within this
    fresh_s: float = 90.0               # a series whose newest sample is older: its process is not exporting
    lookback_s: float = 3600.0          # a target seen within this and not fresh now: missing
    interval_s: float | None = None     # the groups' evaluation interval (None: Prometheus' global one)
    for_s: dict[str, float] = field(default_factory=lambda: dict(FOR_DEFAULTS))
    prometheus_url: str = "http://127.0.0.1:9090"   # named in the runbook line
    agent_scrape_job: str = "otel-gpu-agent"         # scrape job of agents read over --prometheus-port

    def with_for(self, seconds: float) -> "RuleParams":
        """The same, with one `for:` for every alert (tests)."""
        return replace(self, for_s={k: seconds for k in FOR_DEFAULTS})

    def problems(self, stall_min_s: float) -> list[str]:
        """What makes these parameters unusable, one line each (empty: fine)."""
        out = []
        for name in ("window_s", "periodic_window_s", "gpu_window_s", "error_window_s", "fresh_s", "lookback_s"):
            if not getattr(self, name) > 0:
                out.append(f"{name.removesuffix('_s').replace('_', '-')} must be positive")
        if self.fresh_s >= stall_min_s:
            # a job that ended stops exporting: its last step ages past the stall threshold only after
            # its series are no longer fresh, so a finished job is never called stalled
            out.append(f"--fresh ({duration(self.fresh_s)}) must be shorter than the stall threshold's floor "
                       f"({duration(stall_min_s)})")
        if self.lookback_s <= self.fresh_s:
            out.append("--lookback must be longer than --fresh")
        return out


def duration(seconds: float) -> str:
    """A Prometheus duration: `5m`, `90s`, `1h`, `1h30m`, `250ms` (rounded to the millisecond)."""
    ms = int(round(seconds * 1000))
    if ms <= 0:
        return "0s"
    if ms % 1000:
        return f"{ms}ms"
    s, out = ms // 1000, ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out
