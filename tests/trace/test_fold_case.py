"""FoldedPattern: the lowercased pattern on a lowercased ASCII name matches exactly where the
IGNORECASE pattern matches the name (same positions, same groups), for every pattern that uses it."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.trace import gemm_kernels, name_tags
from otel_gpu.trace.fold_case import FoldedPattern, folded

PATTERNS = [*gemm_kernels.PATTERNS, *(p for p in name_tags.TAGS.values() if isinstance(p, FoldedPattern))]
# names built from the patterns' own pieces in any case, and from characters around them
PIECES = sorted({w for p in PATTERNS for w in re.findall(r"[A-Za-z0-9]+", p.pattern)}) + \
    ["_", ":", "::", "<", ">", " ", "(", "void ", "aten::", "sm_", "sm", "ldg", "align", "\u0130", "\u212a", "ß"]


def _any_case(piece: str, flips: int) -> str:
    return "".join(c.upper() if (flips >> (i % 16)) & 1 else c for i, c in enumerate(piece))


names = st.lists(st.tuples(st.sampled_from(PIECES), st.integers(0, 1 << 16)), max_size=12).map(
    lambda parts: "".join(_any_case(p, f) for p, f in parts)) | st.text(max_size=40)


def _lower(found: list) -> list:
    """findall's strings (or tuples of group strings) lowercased: the folded pattern returns the
    lowercased text of what the IGNORECASE one returns."""
    return [tuple(g.lower() for g in x) if isinstance(x, tuple) else x.lower() for x in found]


@settings(max_examples=600, deadline=None)
@given(names)
def test_folded_matches_where_ignorecase_matches(name):
    low = folded(name)
    for p in PATTERNS:
        reference = re.compile(p.pattern, re.IGNORECASE)
        want, got = reference.search(name), p.search(name, low)
        assert (want is None) == (got is None), (p.pattern, name)
        if want is not None:
            assert want.span() == got.span() and [g is None for g in want.groups()] == \
                [g is None for g in got.groups()], (p.pattern, name)
            assert [g.lower() if g else g for g in want.groups()] == [g.lower() if g else g for g in got.groups()]
        assert _lower(reference.findall(name)) == _lower(p.findall(name, low))


def test_non_ascii_names_use_the_ignorecase_pattern():
    assert folded("Memcpy DtoD") == "memcpy dtod" and folded("K\u212aernel") is None
    p = FoldedPattern(r"kk")
    assert p.search("K\u212a", folded("K\u212a")) is not None   # the Kelvin sign folds to k under IGNORECASE


def test_an_uppercase_escape_is_refused():
    with pytest.raises(ValueError, match="cannot be folded"):
        FoldedPattern(r"gemm\W")
