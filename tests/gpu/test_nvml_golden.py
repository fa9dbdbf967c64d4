"""The NVML source's readings over the fake, and the fake's answers, stay byte-identical to
what they were before either was made cheaper (tests/gpu/nvml_scenario.py)."""
from __future__ import annotations

from pathlib import Path

from . import nvml_scenario

GOLDEN = Path(__file__).parent / "data" / "nvml_golden.txt"


def test_reads_match_the_golden_digests():
    want = GOLDEN.read_text().split("\n")[:-1]
    got = nvml_scenario.digests()
    assert [w.split()[0] for w in want] == [g.split()[0] for g in got]
    for w, g in zip(want, got):
        assert w == g, f"{w.split()[0]}: `python tests/gpu/nvml_scenario.py --full {w.split()[0]}` differs"
