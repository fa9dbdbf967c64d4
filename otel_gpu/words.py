"""Words in human-facing output: counts with the right plural (pure)."""
from __future__ import annotations

# plurals that are not the word + "s"
_IRREGULAR = {"process": "processes", "series": "series", "query": "queries", "directory": "directories",
              "copy": "copies", "entry": "entries", "child": "children", "GPU-s": "GPU-s"}


def plural_of(word: str) -> str:
    """``rank`` -> ``ranks``, ``process`` -> ``processes``, ``series`` -> ``series``."""
    return _IRREGULAR.get(word, word + "s")


def count(n: float, word: str, many: str | None = None, sep: bool = True) -> str:
    """``count(1, "rank")`` -> ``1 rank``; ``count(3, "rank")`` -> ``3 ranks``; ``count(1200, "event")``
    -> ``1,200 events`` (``sep=False``: ``1200``). Only exactly one takes the singular (0 ranks,
    1.5 steps); ``many`` names an irregular plural."""
    one = n == 1
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    shown = f"{n:,}" if sep and isinstance(n, int) else f"{n:g}" if isinstance(n, float) else str(n)
    return f"{shown} {word if one else (many or plural_of(word))}"
