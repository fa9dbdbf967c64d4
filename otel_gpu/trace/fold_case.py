"""Case-insensitive name patterns, cheaper: Python's regex engine runs a pattern compiled with
IGNORECASE 3-10x slower than the same pattern without it (kernel names run to 2,000 characters,
and every worker classifies every distinct name once). On an ASCII name, the pattern with its
letters lowercased matches the lowercased name exactly where the IGNORECASE pattern matches the
name, at the same positions; any other name goes through the IGNORECASE pattern.
"""
from __future__ import annotations

import re


class FoldedPattern:
    """``re.compile(pattern, re.IGNORECASE)`` whose ``search``/``findall`` take the name and, for
    an ASCII name, its lowercased text (``folded(name)``)."""

    def __init__(self, pattern: str):
        if re.search(r"\\[A-Z]", pattern):   # \W, \S, \D, \B... would change meaning once lowercased
            raise ValueError(f"uppercase escape in {pattern!r}: cannot be folded")
        self.pattern = pattern
        self._any = re.compile(pattern, re.IGNORECASE)
        self._ascii = re.compile(pattern.lower())

    def search(self, name: str, low: str | None):
        return self._ascii.search(low) if low is not None else self._any.search(name)

    def findall(self, name: str, low: str | None) -> list:
        return self._ascii.findall(low) if low is not None else self._any.findall(name)


def folded(name: str) -> str | None:
    """The name lowercased when it is ASCII (then FoldedPattern matches it fast), else None."""
    return name.lower() if name.isascii() else None
