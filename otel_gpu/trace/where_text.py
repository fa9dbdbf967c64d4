"""One-line texts for the evidence a finding's ``where`` carries beyond ops, kernels and steps
(idle causes, shapes, alignment, device, queue depth, syncs not counted)."""
from __future__ import annotations


def _pct(x) -> str:
    return f"{x:.0f}%" if x >= 1 else f"{x:.1g}%"


def where_details(w: dict) -> list[str]:
    """Texts for the terminal, in the order an expert reads them; nothing for absent evidence."""
    parts: list[str] = []
    if w.get("idle_causes"):
        parts.append("idle by cause: " + ", ".join(f"{label} {_pct(pct)}" for label, _, pct in w["idle_causes"]))
    shapes = w.get("shapes")
    if isinstance(shapes, str):
        parts.append(f"shapes: {shapes}")
    elif shapes:
        parts.append("shapes: " + ", ".join(f"{s} x{n}" for s, n in shapes[:2]))
    if w.get("misaligned_dims"):
        parts.append("dims breaking 16-byte alignment: " + ", ".join(f"{d:,}" for d in w["misaligned_dims"][:5]))
    if w.get("alignment"):
        parts.append("kernel variants: " + ", ".join(w["alignment"]))
    if w.get("device") and w.get("kernel_archs"):
        parts.append(f"device {w['device']}, kernels built for {', '.join(w['kernel_archs'])}")
    if w.get("position_in_step_pct") is not None:
        queued = w.get("queue_before_sync")
        parts.append(f"at {w['position_in_step_pct']:g}% of the step" +
                     (f", {queued:g} launches queued when it began" if queued is not None else ""))
    fill = w.get("drained_idle_fill_us") or {}
    if fill.get("data_loader_us") or fill.get("h2d_copy_call_us"):
        parts.append(f"then exposed: data loader {fill.get('data_loader_us', 0):,.0f} us, "
                     f"H2D copy calls {fill.get('h2d_copy_call_us', 0):,.0f} us")
    if w.get("median_queue_at_launch") is not None:
        parts.append(f"median queue at launch {w['median_queue_at_launch']:g}, "
                     f"{w.get('short_kernels_pct', 0):g}% short kernels")
    if w.get("refill_idle_us"):
        parts.append(f"refilling the drained queue after it {w['refill_idle_us']:,.0f} us")
    if w.get("profiler_overhead"):
        parts.append(w["profiler_overhead"]["text"])
    nc = w.get("not_counted")
    if nc:
        scope = f" (in {nc['scopes'][0][0]})" if nc.get("scopes") else ""
        parts.append(f"not counted: {nc['per_step']:g} framework/short event syncs per step{scope}")
    if w.get("gpu_idle_during_calls_us"):
        parts.append(f"GPU idle during the copy calls {w['gpu_idle_during_calls_us']:,.0f} us")
    return parts
