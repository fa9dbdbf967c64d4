"""bench/rss_breakdown.py's smaps parser: resident KB per mapping, for any layout of mappings."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from hypothesis import given, strategies as st

_spec = importlib.util.spec_from_file_location(
    "rss_breakdown", Path(__file__).resolve().parents[1] / "bench" / "rss_breakdown.py")
rss_breakdown = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rss_breakdown)

_paths = st.sampled_from(["", "[heap]", "[stack]", "/usr/lib/libnvidia-ml.so.580.1", "/usr/bin/python3.12"])


def _smaps(mappings: list[tuple[str, int]]) -> str:
    lines = []
    for i, (path, rss) in enumerate(mappings):
        lines.append(f"7f{i:010x}000-7f{i:010x}fff r-xp 00000000 08:01 {i} {path}".rstrip())
        lines += ["Size:                  4 kB", f"Rss:            {rss:8d} kB", "Pss:                   1 kB",
                  "VmFlags: rd ex mr mw me"]
    return "\n".join(lines) + "\n"


@given(st.lists(st.tuples(_paths, st.integers(0, 10**7)), max_size=40))
def test_totals_per_mapping(mappings):
    expected: dict[str, int] = {}
    for path, rss in mappings:
        expected[path or "[anon]"] = expected.get(path or "[anon]", 0) + rss
    got = rss_breakdown.mapping_rss_kb(_smaps(mappings))
    assert {k: v for k, v in got.items()} == {k: v for k, v in expected.items()}


def test_this_process_adds_up_to_its_rss():
    """On a live process the mappings' Rss sum to the status RSS (within pages that moved between reads)."""
    got = rss_breakdown.mapping_rss_kb(Path(f"/proc/{os.getpid()}/smaps").read_text())
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
    assert abs(sum(got.values()) - rss) < 0.05 * rss
