"""Number and name formatting shared by the rules (pure)."""
from __future__ import annotations

import re
from datetime import datetime, timezone

from ..words import count  # noqa: F401  (the rules' "1 rank", "3 ranks")


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def secs(s: float | None) -> str:
    """Seconds for humans: 850 ms, 12.4 s, 3.2 min, 5.1 h."""
    if s is None:
        return "n/a"
    if abs(s) < 1:
        return f"{s * 1000:.0f} ms"
    if abs(s) < 10:
        return f"{s:.3g} s"
    if abs(s) < 120:
        return f"{s:.1f} s"
    if abs(s) < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def gpu_time(s: float, unit: str = "GPU") -> str:
    """GPU-seconds as GPU-s / GPU-min / GPU-h; `unit` "rank" for a window without GPUs (rank-s, ...)."""
    if s < 120:
        return f"{s:.1f} {unit}-s"
    if s < 7200:
        return f"{s / 60:.1f} {unit}-min"
    return f"{s / 3600:.1f} {unit}-h"


def rate(bps: float | None) -> str:
    """Bytes per second as GB/s, MB/s, kB/s (decimal units, as link speeds are quoted)."""
    if bps is None:
        return "n/a"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(bps) >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"


def size(b: float | None) -> str:
    if b is None:
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")


def span(a: float, b: float, date: bool = False) -> str:
    if date:
        day = datetime.fromtimestamp(a, timezone.utc).strftime("%Y-%m-%d")
        return f"{day} {when(a)}-{when(b)} UTC"
    return f"{when(a)}-{when(b)} UTC"


def _natural(s: str):
    return [int(p) if p.isascii() and p.isdigit() else p for p in re.split(r"([0-9]+)", s)]


def compact(items, limit: int = 8) -> str:
    """Names in natural order, numeric runs folded ("0-7, 9"), at most `limit` shown."""
    items = sorted(set(items), key=_natural)
    if items and all(i.isascii() and i.isdigit() for i in items):
        nums, runs = [int(i) for i in items], []
        start = prev = nums[0]
        for n in nums[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            if n is not None:
                start = prev = n
        items = runs
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
