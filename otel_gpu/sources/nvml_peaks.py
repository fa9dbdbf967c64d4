"""The peak-rate readings of one NVML device (otelgpu.gpu.peak.flops per dtype), from its name.

Built once per device (its name does not change while the agent runs) and repeated every round;
a device whose name is not in the peak table (otel_gpu/peaks.py) has none.
"""
from __future__ import annotations

from .. import names as N
from ..peaks import DTYPES, peak_of
from ..readings import Reading


def peak_readings(dev) -> list[Reading]:
    """One reading per dtype the device's product has a dense peak for (FLOP/s); [] when not in the table."""
    out = getattr(dev, "peak_out", None)
    if out is None:
        peak = peak_of(dev.name)
        out = [Reading(N.GPU_PEAK_FLOPS, peak.flops[d], dev.tagged(N.DTYPE, d)) for d in DTYPES if d in peak.flops]
        dev.peak_out = out
    return out
