"""Checks that name the biggest expert-level opportunities in a GPU trace, beside :mod:`.findings`:

- ``queue_drain_sync``: a user sync (``.item()``, ``.cpu()``, ``synchronize()``) at which the GPU ran
  dry, in most steps: the launch queue built up ahead of the GPU is thrown away and everything the
  CPU does next (data loading, host-to-device copies, Python) is exposed as GPU idle;
- ``gemm_misaligned``: GEMM/conv kernels for misaligned operands (``align1``/``align2`` names): a
  dimension not a multiple of 8 for 16-bit types keeps the tensor cores from full-width loads;
- ``gemm_old_arch``: GEMM kernels built for an older architecture than the device (sm80 on sm90);
- ``gemm_fp32``: fp32 GEMMs without tensor cores (``sgemm``) in a run whose other GEMMs are 16-bit.

Each function takes the rank's checker (``findings._Checker``) and reports one check. Times in us.
"""
from __future__ import annotations

import numpy as np

from .gemm_kernels import classify, device_arch, misaligned_dims, older_arch
from .idle_causes import CAUSES, LABELS
from .op_shapes import input_shapes
from .steps import step_of

SYNC_DRAIN = CAUSES.index("sync_drain")
SHAPE_PATTERNS = ("gemm_misaligned", "gemm_old_arch", "gemm_fp32", "pageable_h2d")


def queue_drain_sync(ch) -> None:
    """Steps in which a user sync drained the GPU; time at stake: the idle in the gaps that began
    inside those syncs (until the CPU launched work again) and in the gaps of refilling the queue
    after them (``sync_refill``, see :mod:`.idle_causes`)."""
    th, att = ch.th, ch.att
    label = "steps with a sync that drained the GPU, % of steps followed by GPU work" if ch.windows else \
        "syncs that drained the GPU in the trace (no ProfilerStep)"
    if att is None:
        ch.report("queue_drain_sync", label, 0.0, th.drain_steps_pct if ch.windows else th.drain_min_count, False)
        return
    m = att["cause"] == SYNC_DRAIN
    g0, g1 = att["gap_start"][m], att["gap_end"][m]
    of = att["refill_of"]
    refill = (of >= 0) & (att["cause"][np.maximum(of, 0)] == SYNC_DRAIN)
    refill_us = float((att["gap_end"][refill] - att["gap_start"][refill]).sum())
    syncs = ch.sync_cls["rows"][ch.sync_cls["user"]]
    s0, s1 = ch.intervals(syncs)
    order = np.argsort(s0, kind="stable")
    s0, s1, syncs = s0[order], s1[order], syncs[order]
    j = np.searchsorted(s0, g0, "right") - 1  # the latest-starting user sync begun before each drain
    j = np.maximum(j, 0)
    rows = np.unique(syncs[j]) if len(syncs) else syncs   # each sync once, however many gaps it drained
    if ch.windows:
        # a step ending after the GPU's last event has no measured idle after it: not counted, above or below
        end = float(ch.k["end"].max()) if len(ch.k["end"]) else 0.0
        counted_steps = {num for num, _, b in ch.windows if b <= end}
        steps = (set(step_of(g0, ch.windows).tolist()) - {-1}) & counted_steps
        counted = max(1, len(counted_steps))
        value, threshold = 100.0 * len(steps) / counted, th.drain_steps_pct
        hit = len(steps) > 0 and value >= threshold
    else:
        value, threshold = float(len(g0)), th.drain_min_count
        hit = len(g0) >= threshold
    pos = _positions_in_step(g0, ch.windows)
    depth = ch.queue_depth_at(s0[j]) if len(g0) and len(syncs) else np.zeros(0)
    fill = att["fill_us"].get("sync_drain", {})
    where = {"ops": ch.ops_of(rows), "calls": ch.names_of(rows), "steps": ch.steps_of(rows), "count": int(len(g0)),
             "position_in_step_pct": round(float(np.median(pos)), 1) if pos else None,
             "queue_before_sync": round(float(np.median(depth)), 1) if len(depth) else None,
             "drained_idle_fill_us": fill, "refill_idle_us": round(refill_us, 1)}
    at_stake = float((g1 - g0).sum()) + refill_us
    ch.report("queue_drain_sync", label, value, threshold, hit, where, at_stake, idle_caused_us=at_stake)


def _positions_in_step(times: np.ndarray, windows: list) -> list[float]:
    """``where_in_step(t, windows)[1]`` of each time (us) that falls in a step, in one pass."""
    if not windows or not len(times):
        return []
    span: dict[int, tuple[float, float]] = {}
    for num, a, b in windows:
        if b > a:
            span.setdefault(num, (a, b))
    if not span:
        return []
    nums = np.array(sorted(span), dtype=np.int64)
    a = np.array([span[n][0] for n in nums.tolist()], dtype=np.float64)
    b = np.array([span[n][1] for n in nums.tolist()], dtype=np.float64)
    step = step_of(times, windows)
    j = np.minimum(np.searchsorted(nums, step), len(nums) - 1)
    hit = nums[j] == step
    t, j = np.asarray(times, dtype=np.float64)[hit], j[hit]
    # the same float operations, in the same order, as where_in_step; rounded as Python rounds
    return [round(x, 1) for x in (100 * (t - a[j]) / (b[j] - a[j])).tolist()]


def _gemm_where(ch, rows: np.ndarray, extra: dict | None = None) -> dict:
    return {"kernels": ch.names_of(rows), "ops": ch.ops_of(rows), "steps": ch.steps_of(rows),
            "streams": sorted(set(ch.v.ev.stream[rows].tolist()))[:10], "count": int(len(rows)), **(extra or {})}


def gemm_checks(ch) -> None:
    """The three GEMM checks of a rank, from its kernel names (and the device the trace names)."""
    th, k, v = ch.th, ch.k, ch.v
    uniq, inv = np.unique(k["name"], return_inverse=True)
    inv = inv.reshape(-1)
    kinds = [classify(v.names[n]) for n in uniq.tolist()]
    arch, dev_name = device_arch(v.ev.meta)

    def per_kernel(flag) -> np.ndarray:
        return np.array([bool(flag(g)) for g in kinds], dtype=bool)[inv] if kinds else np.zeros(0, bool)
    dur = k["dur"].astype(np.float64)
    gemm, mis = per_kernel(lambda g: g.gemm), per_kernel(lambda g: g.misaligned)
    gemm_us = float(dur[gemm].sum())
    present = {int(i) for i in np.unique(inv).tolist()} if len(inv) else set()

    def pct(mask: np.ndarray) -> float:
        return 100.0 * float(dur[mask].sum()) / gemm_us if gemm_us else 0.0

    def ext(mask: np.ndarray) -> list[int]:
        return v.ev.external_id[k["rows"][mask]].tolist()
    aligns = sorted({f"align{kinds[i].align}" for i in present if kinds[i].misaligned})
    extra = {"alignment": aligns}
    old_mis = sorted({f"sm{kinds[i].arch}" for i in present if kinds[i].misaligned and older_arch(kinds[i], arch)})
    if old_mis:  # cuBLAS on Hopper falls back to Ampere kernels for misaligned operands
        extra.update(device=f"{dev_name} (sm{arch})", kernel_archs=old_mis)
    ch.report("gemm_misaligned", "misaligned GEMM/conv kernels, % of GEMM time", pct(mis), th.gemm_misaligned_pct,
              pct(mis) >= th.gemm_misaligned_pct, _gemm_where(ch, k["rows"][mis], extra),
              float(dur[mis].sum()), gemm_time_us=gemm_us, _shape_ext=ext(mis))
    if arch is None:
        ch.report("gemm_old_arch", "GEMM kernels built for an older GPU, % of GEMM time (not checked: the trace "
                  "names no NVIDIA device)", 0.0, th.gemm_old_arch_pct, False)
    else:
        def tensor_core_old(g) -> bool:
            return older_arch(g, arch) and not g.misaligned and not g.fp32_simt
        old = per_kernel(tensor_core_old)
        archs = sorted({f"sm{kinds[i].arch}" for i in present if tensor_core_old(kinds[i])})
        ch.report("gemm_old_arch", f"GEMM kernels built for a GPU older than sm{arch} (misaligned and fp32 ones "
                  "counted apart), % of GEMM time", pct(old), th.gemm_old_arch_pct, pct(old) >= th.gemm_old_arch_pct,
                  _gemm_where(ch, k["rows"][old], {"device": f"{dev_name} (sm{arch})", "kernel_archs": archs}),
                  float(dur[old].sum()), gemm_time_us=gemm_us, _shape_ext=ext(old))
    low, simt = per_kernel(lambda g: g.low_precision), per_kernel(lambda g: g.fp32_simt)
    mixed = pct(low) >= th.low_precision_gemm_pct
    label = "fp32 GEMMs without tensor cores in a 16-bit run, % of GEMM time"
    ch.report("gemm_fp32", label if mixed else label + " (no 16-bit GEMMs: not checked)", pct(simt),
              th.gemm_fp32_pct, mixed and pct(simt) >= th.gemm_fp32_pct,
              _gemm_where(ch, k["rows"][simt], {"low_precision_gemm_pct": round(pct(low), 1)}),
              float(dur[simt].sum()), gemm_time_us=gemm_us, _shape_ext=ext(simt))


def shapes_where(shapes: dict[int, dict], ext_ids: list[int], top: int = 3, gemm: bool = True) -> dict:
    """``where`` entries from the operators' input shapes: the most frequent (op, dims, types) and the
    dimensions that break 16-byte alignment."""
    counts: dict[tuple, int] = {}
    bad: list[int] = []
    for e in ext_ids:
        s = shapes.get(e)
        if s is None:
            continue
        key = (s["op"], repr(s["dims"]), _types_text(s["types"]))
        counts[key] = counts.get(key, 0) + 1
        bad += [d for d in misaligned_dims(s["dims"], s["types"]) if d not in bad]
    shown = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
    out = {"shapes": [[f"{op} {dims}" + (f" {types}" if types else ""), n] for (op, dims, types), n in shown]
           or "none recorded for the operators of these kernels"}
    return {**out, "misaligned_dims": sorted(bad)[:10]} if gemm else out


def add_shapes(checks: list[dict], sources: dict[int, tuple[str, bool]]) -> None:
    """Name the operators' input shapes on the worst rank of each reported pattern that has kernels
    or copies behind it, when the trace recorded shapes (``sources``: rank -> (trace file, shapes
    recorded)); the private id lists are dropped. A file is read once for all the patterns whose
    worst rank it holds."""
    wanted: dict[int, list[tuple[dict, list[int], str]]] = {}   # rank -> (check, its ids, pattern)
    for pattern in SHAPE_PATTERNS:
        hit = [c for c in checks if c["pattern"] == pattern and "_shape_ext" in c]
        if not hit:
            continue
        worst = max(hit, key=lambda c: c["time_at_stake_us"])
        if not sources[worst["rank"]][1]:
            worst["where"]["shapes"] = "not in the trace (profile with record_shapes=True)"
            continue
        ext = [e for e in worst["_shape_ext"] if e >= 0][:5000]
        wanted.setdefault(worst["rank"], []).append((worst, ext, pattern))
    for rank, asks in wanted.items():
        shapes, why = input_shapes(sources[rank][0], {e for _, ext, _ in asks for e in ext})
        for worst, ext, pattern in asks:
            worst["where"].update(shapes_where(shapes, ext, gemm=pattern.startswith("gemm_")))
            if why and ext:   # (a pattern without ids asked for nothing: no note, as when read alone)
                worst["where"]["shapes_note"] = why
    for c in checks:
        c.pop("_shape_ext", None)


def _types_text(types) -> str:
    if not isinstance(types, list):
        return ""
    kinds = sorted({str(t).replace("c10::", "") for t in types if t not in ("", None)})
    return "/".join(kinds)


def idle_fix(att: dict | None) -> str:
    """Advice for GPU idle, led by its biggest causes."""
    tips = {"sync_drain": "move the draining .item()/sync off the step (log every N steps, non_blocking copies)",
            "framework_sync": "check the framework's sync points (DDP/FSDP settings, find_unused_parameters)",
            "h2d_copy": "pin host memory (DataLoader(pin_memory=True)) and copy with non_blocking=True",
            "allocator": "keep allocations in the caching allocator (no empty_cache(), expandable_segments:True)",
            "communication": "overlap communication with compute and look for a straggler",
            "data_loader": "more DataLoader workers, prefetch_factor, persistent_workers",
            "sync_refill": "keep the queue full: read synced values every N steps, so the CPU stays ahead",
            "launch_starvation": "cut launch overhead: torch.compile, CUDA graphs, larger batches",
            "queued_work_waited": "look for cross-stream and event waits in the largest gaps",
            "unattributed": "profile the CPU side (with_stack=True) to see what precedes the largest gaps"}
    if not att or not att["by_cause_us"]:
        return "The GPU waits: look at what the CPU does in the largest gaps."
    top = sorted(att["by_cause_us"].items(), key=lambda kv: -kv[1])[:2]
    return "The GPU waits; biggest causes first: " + "; ".join(
        f"{LABELS[c]} ({att['share_pct'].get(c, 0):g}% of the idle): {tips[c]}" for c, _ in top) + "."
