"""What a recording's content must be (pure checks): a recording is a file anyone could have edited,
and content that is not what the store writes is one `ContentError` saying what, which the reader
reports as an unreadable recording (never another exception)."""
from __future__ import annotations

import json
import math


class ContentError(ValueError):
    """Content that is not what the store writes: one line saying what."""


def meta_problem(meta: dict) -> str | None:
    """What is wrong with a recording's meta (pure): times that are no finite number, a command that
    is no JSON list of strings; None when it is as the store writes it."""
    for key in ("started", "ended"):
        if meta.get(key):
            try:
                ok = math.isfinite(float(meta[key]))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                return f"meta {key!r} is not a time: {str(meta[key])[:40]!r}"
    if meta.get("command") is not None:
        try:
            command = json.loads(meta["command"])
        except (TypeError, ValueError):
            command = None
        if not (isinstance(command, list) and all(isinstance(c, str) for c in command)):
            return f"meta 'command' is not a JSON list of strings: {str(meta['command'])[:40]!r}"
    return None


def json_object(text, what: str) -> dict[str, str]:
    """A JSON object of attributes or labels, its values as text; ContentError when it is not one."""
    try:
        got = json.loads(text)
    except (TypeError, ValueError):
        got = None
    if not isinstance(got, dict):
        raise ContentError(f"{what} is not a JSON object: {str(text)[:40]!r}")
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in got.items()}


def number(x, what: str):
    """A value read from the points: a number (or None); ContentError for anything else (text)."""
    if x is None or x.__class__ in (float, int):
        return x
    raise ContentError(f"{what} is not a number: {str(x)[:40]!r}")


def frames(text) -> list[str]:
    """A stack as stored (a JSON list of function names, root first); ContentError when it is not one."""
    try:
        got = json.loads(text)
    except (TypeError, ValueError):
        got = None
    if not (isinstance(got, list) and all(isinstance(f, str) for f in got)):
        raise ContentError(f"a stack is not a JSON list of names: {str(text)[:40]!r}")
    return got


def numbers(x) -> list[float] | None:
    """Histogram bounds or counts as stored (a JSON list of finite numbers), else None (left out)."""
    if not isinstance(x, list) or not all(v.__class__ in (float, int) and math.isfinite(v) for v in x):
        return None
    return [float(v) for v in x]


# a point value that is a number (NaN is stored as NULL; 9e999 is SQLite's infinity)
FINITE = "p.value IS NOT NULL AND p.value NOT IN (9e999, -9e999)"
