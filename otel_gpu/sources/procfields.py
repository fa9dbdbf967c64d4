"""Numeric fields of /proc and /sys counter files (pure).

Counters and sizes there are non-negative decimal integers. A field with a sign, a fraction or
anything else is malformed: the parsers skip the row (or the field) it is in and say so, the
source counts it as a read error (`otelgpu.agent.source.errors`) and lists it under `unreadable`
in `otel-gpu doctor`; such a value is never exported.
"""
from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]+")


def counter(text: str) -> int:
    """`text` (surrounding whitespace allowed) as a non-negative integer; ValueError otherwise."""
    stripped = text.strip()
    if not _DIGITS.fullmatch(stripped):
        raise ValueError(f"{stripped[:40]!r} is not a non-negative integer")
    return int(stripped)
