"""A scrape's bytes are those the agent rendered before its scrape path was made cheaper."""
from __future__ import annotations

import hashlib
from pathlib import Path

from tests.agent.scrape_scenario import golden_text, scrapes

GOLDEN = Path(__file__).parent / "data" / "scrape_golden.txt"


def test_every_scrape_of_the_fixed_scenario_matches_the_golden_byte_for_byte():
    bodies = scrapes()
    got, want = golden_text(bodies).splitlines(), GOLDEN.read_text().splitlines()
    assert len(got) == len(want)
    for line, expected in zip(got, want):
        assert line == expected, ("scrape differs from the golden; diff the texts: "
                                  "python tests/agent/scrape_scenario.py --full [--root OTHER_CHECKOUT]")
    # the scenario exercises what it claims: non-finite values, escapes, series coming and going
    text = b"".join(bodies)
    assert b" NaN\n" in text and b" +Inf\n" in text and b" -Inf\n" in text and b'\\"' in text
    assert len({len(b) for b in bodies}) > 3
    assert hashlib.sha256(bodies[0]).hexdigest() in GOLDEN.read_text()
