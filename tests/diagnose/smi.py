"""Real nvidia-smi captures (samples/nvidia_smi_captures in the shared test material, see
tests/shared_data.py) as series for backfill.

Parsers (pure): `dmon_rows` reads a `nvidia-smi dmon` table, `query_gpu` one state's
`--query-gpu` CSV (power limit, memory, clock-event mask) from a capture file. `write_capture_job`
plays the captured rows back as a node's GPU series: `load` rows while training, `idle` rows
during stalls of `stall_s` every `period_s`, sampled every second like `dmon`.
"""
from __future__ import annotations

import re
from otel_gpu.sources.nvml import clock_reason_values

from tests.shared_data import needs_shared_data, shared_data

from .backfill import OpenMetricsWriter

WHERE = ("samples", "nvidia_smi_captures")
CAPTURES = shared_data(*WHERE)
needs_captures = needs_shared_data(*WHERE)   # skip mark of the tests that read the played-back captures
MODELS = {"h100": "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01",
          "h200": "linux-x86_64__nvidia-h200__590.48.01",
          "h100-mig": "linux-x86_64__nvidia-h100-mig__590.48.01"}


def dmon_rows(text: str) -> list[dict[str, float | None]]:
    """Rows of a dmon table: column -> number ('-' -> None). Header: the first '# gpu ...' line."""
    cols: list[str] | None = None
    rows = []
    for line in text.splitlines():
        if line.startswith("#"):
            if cols is None and line[1:].split()[:1] == ["gpu"]:
                cols = line[1:].split()
            continue
        parts = line.split()
        if not parts or cols is None:
            continue
        if len(parts) != len(cols):
            raise ValueError(f"dmon row has {len(parts)} fields, header {len(cols)}: {line!r}")
        rows.append({c: (None if v == "-" else float(v)) for c, v in zip(cols, parts)})
    return rows


def _number(text: str) -> float | str | None:
    v = text.strip()
    if v.startswith("[") or v in ("N/A", ""):
        return None
    if re.fullmatch(r"0x[0-9A-Fa-f]+", v):
        return float(int(v, 16))
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)(?: [A-Za-z%]+)?", v)
    return float(m.group(1)) if m else v


def query_gpu(text: str, state: str) -> dict[str, float | str | None]:
    """The `--query-gpu` CSV of one state ('idle' or 'load'): field (units dropped) -> value."""
    lines = text.splitlines()
    head = f"# {state} :: query-gpu (csv, what the exporter parses)"
    i = lines.index(head)
    rows = [ln for ln in lines[i + 1:i + 8] if ln and not ln.startswith("#")]
    names = [re.sub(r" \[.*\]$", "", h.strip()) for h in rows[0].split(", ")]
    values = [_number(v) for v in rows[1].split(", ")]
    if len(names) != len(values):
        raise ValueError(f"query-gpu {state}: {len(names)} fields, {len(values)} values")
    return dict(zip(names, values))


def capture(model: str) -> dict:
    """dmon rows and query-gpu fields of both states for one captured GPU model."""
    stem = MODELS[model]
    full = (CAPTURES / f"{stem}.txt").read_text()
    return {state: {"dmon": dmon_rows((CAPTURES / f"{stem}__dmon_{state}.txt").read_text()),
                    "query": query_gpu(full, state)} for state in ("idle", "load")}


def write_capture_job(om: OpenMetricsWriter, job: str, models: list[str], start: float, duration: float,
                      period_s: float = 70.0, stall_s: float = 10.0) -> None:
    """One node per model, one GPU each; 1 s samples; idle rows in the last `stall_s` of every period."""
    times = [start + k + 1.0 for k in range(int(duration))]
    caps = {m: capture(m) for m in models}

    def state(t: float) -> str:
        return "idle" if (t - start) % period_s >= period_s - stall_s else "load"

    def labels(m: str) -> dict[str, str]:
        return {"otelgpu_job": job, "host_name": f"smi-{m}", "hw_id": f"GPU-capture-{m}", "otelgpu_gpu_index": "0",
                "hw_name": str(caps[m]["load"]["query"].get("name"))}

    def rows(m: str, column: str, scale: float = 1.0):
        out = []
        for k, t in enumerate(times):
            r = caps[m][state(t)]["dmon"][k % len(caps[m][state(t)]["dmon"])]
            out.append(None if r[column] is None else r[column] * scale)
        return out

    def family(name: str, column: str, scale: float = 1.0, extra: dict | None = None):
        om.family(name, "gauge")
        for m in models:
            values = rows(m, column, scale)
            keep = [(t, v) for t, v in zip(times, values) if v is not None]
            if keep:
                om.series(name, {**labels(m), **(extra or {})}, [t for t, _ in keep], [v for _, v in keep])

    family("hw_gpu_utilization_ratio", "sm", 0.01)          # dmon 'sm' is NVML utilization.gpu
    family("hw_gpu_memory_utilization_ratio", "mem", 0.01)
    family("hw_power_watts", "pwr")
    family("hw_temperature_celsius", "gtemp")
    family("otelgpu_gpu_clock_hertz", "pclk", 1e6, {"otelgpu_clock_domain": "sm"})

    def from_query(name: str, field: str, scale: float = 1.0, every: int = 1):
        om.family(name, "gauge")
        for m in models:
            ts = times[::every]
            om.series(name, labels(m), ts, [float(caps[m][state(t)]["query"][field]) * scale for t in ts])

    from_query("hw_power_limit_watts", "enforced.power.limit", every=10)
    from_query("hw_gpu_memory_limit_bytes", "memory.total", 1 << 20, every=10)
    from_query("hw_gpu_memory_usage_bytes", "memory.used", 1 << 20)
    om.family("otelgpu_gpu_clock_event_active", "gauge")
    for m in models:
        per_reason: dict[str, list[float]] = {}
        for t in times:
            mask = int(caps[m][state(t)]["query"]["clocks_event_reasons.active"])
            for reason, v in clock_reason_values(mask).items():
                per_reason.setdefault(reason, []).append(float(v))
        for reason, values in per_reason.items():
            om.series("otelgpu_gpu_clock_event_active", {**labels(m), "otelgpu_clock_event_reason": reason}, times, values)
