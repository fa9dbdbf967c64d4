"""Words in human-facing output: counts with the right plural (pure)."""
from __future__ import annotations

import re

# plurals that the rules below get wrong
_IRREGULAR = {"series": "series", "child": "children", "GPU-s": "GPU-s", "bus": "buses"}


def plural_of(word: str) -> str:
    """``rank`` -> ``ranks``, ``process`` -> ``processes``, ``query`` -> ``queries``, ``series`` ->
    ``series``; of several words the last takes the plural (``CSV file`` -> ``CSV files``)."""
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if re.search(r"(s|x|z|ch|sh)$", word):
        return word + "es"
    if re.search(r"[^aeiouAEIOU]y$", word):
        return word[:-1] + "ies"
    return word + "s"


def noun(n: float, word: str, many: str | None = None) -> str:
    """``word`` for exactly one, else its plural (``many`` when irregular): ``noun(2, "rank")`` ->
    ``ranks``, for a count shown some other way (a list of ranks, "0-3, 7")."""
    return word if n == 1 else (many or plural_of(word))


def count(n: float, word: str, many: str | None = None, sep: bool = True) -> str:
    """``count(1, "rank")`` -> ``1 rank``; ``count(3, "rank")`` -> ``3 ranks``; ``count(1200, "event")``
    -> ``1,200 events`` (``sep=False``: ``1200``). Only exactly one takes the singular (0 ranks,
    1.5 steps); ``many`` names an irregular plural."""
    one = n == 1
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    shown = f"{n:,}" if sep and isinstance(n, int) else f"{n:g}" if isinstance(n, float) else str(n)
    return f"{shown} {noun(1 if one else 2, word, many)}"


def all_of(n: int, word: str) -> str:
    """``all 8 GPUs``; of a single one ``the only GPU`` (never "all 1 GPUs")."""
    return f"the only {word}" if n == 1 else f"all {count(n, word)}"
