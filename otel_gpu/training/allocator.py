"""PyTorch's CUDA caching allocator, read on the exporter's thread: reserved, allocated and inactive-split
bytes, allocation retries and OOMs per device (`torch.cuda.memory_stats`).

Never initialises CUDA: nothing is read unless the program imported torch and CUDA is already initialised
(`torch.cuda.is_initialized()`); `memory_stats` itself returns {} before that. One read is a copy of the
allocator's counters per device (tens of microseconds), once per export.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any, Mapping

log = logging.getLogger("otel_gpu.training")

KEYS = {"reserved": "reserved_bytes.all.current", "allocated": "allocated_bytes.all.current",
        "inactive_split": "inactive_split_bytes.all.current", "retries": "num_alloc_retries", "ooms": "num_ooms"}


@dataclass(frozen=True)
class AllocatorStats:
    """One device's allocator counters: bytes now (reserved, allocated, inactive split) and counts since the
    process started (retries, OOMs); None where this PyTorch does not report the key."""
    reserved: int | None = None
    allocated: int | None = None
    inactive_split: int | None = None
    retries: int | None = None
    ooms: int | None = None


def _count(v: Any) -> int | None:
    """A non-negative whole number (torch's counters are ints), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not (v.is_integer() and v >= 0):
        return None
    return int(v) if v >= 0 else None


def parse(stats: Mapping[str, Any]) -> AllocatorStats | None:
    """`torch.cuda.memory_stats()` -> AllocatorStats; None for a device the allocator never used (no
    memory reserved ever, no retry, no OOM) or an empty answer (CUDA not initialised)."""
    values: dict[str, int | None] = {}
    for field, key in KEYS.items():
        values[field] = _count(stats.get(key))
    used = stats.get("reserved_bytes.all.peak", values["reserved"])
    if not used and not values["retries"] and not values["ooms"]:
        return None
    return AllocatorStats(**values)


def cuda_of_process():
    """`torch.cuda` when the program imported torch and initialised CUDA itself, else None (never imports
    torch, never initialises a CUDA context)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None:
        return None
    try:
        return cuda if cuda.is_initialized() else None
    except Exception as exc:   # a torch without CUDA support or a broken build: nothing to read
        log.debug("otel-gpu: allocator not read: %r", exc)
        return None


class AllocatorReader:
    """Per-device allocator stats of this process; `cuda` is `torch.cuda` or a stand-in with the same
    `is_initialized`, `device_count` and `memory_stats(device)` (tests replay recorded answers)."""

    def __init__(self, cuda=None):
        self.cuda = cuda
        self.failed = False   # said once: a reader that fails says so and stops reading

    def read(self) -> dict[str, AllocatorStats]:
        """CUDA device ordinal ("0", ...) -> stats, for the devices this process allocated on; {} before
        CUDA is initialised, without torch, or after a failure (logged once)."""
        if self.failed:
            return {}
        cuda = self.cuda if self.cuda is not None else cuda_of_process()
        if cuda is None:
            return {}
        try:
            if not cuda.is_initialized():
                return {}
            out = {}
            for d in range(int(cuda.device_count())):
                stats = parse(cuda.memory_stats(d))
                if stats is not None:
                    out[str(d)] = stats
            return out
        except Exception as exc:  # never let a read break the export (or the training)
            self.failed = True
            log.warning("otel-gpu: CUDA allocator stats not read from now on: %r", exc)
            return {}
