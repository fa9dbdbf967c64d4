"""Parsers for the values of flags and environment variables: finite numbers in a range, URLs.

Pure functions: each returns the parsed value or raises ConfigError with one line naming the
setting and the value (`--trial-timeout='nan': must be a finite number`). `flag_type` adapts
one to argparse, whose errors exit 2 like every other bad input.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable
from urllib.parse import urlsplit

from .errors import ConfigError

INF = math.inf


def number(raw: str | float, what: str, lo: float = -INF, hi: float = INF, kind: type = float,
           lo_open: bool = False) -> float:
    """`raw` as a finite `kind` (float or int) within [lo, hi] ((lo, hi] with `lo_open`)."""
    text = str(raw).strip()
    try:
        value = kind(text)
    except (ValueError, OverflowError):
        raise ConfigError(f"{what}={raw!r}: expected {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{what}={raw!r}: must be a finite number")
    if lo_open and value <= lo:
        raise ConfigError(f"{what}={raw!r}: must be > {lo:g}")
    if not lo <= value <= hi:
        if hi == INF:
            raise ConfigError(f"{what}={raw!r}: must be >= {lo:g}")
        if lo == -INF:
            raise ConfigError(f"{what}={raw!r}: must be <= {hi:g}")
        raise ConfigError(f"{what}={raw!r}: must be between {lo:g} and {hi:g}")
    return value


def http_url(raw: str, what: str) -> str:
    """`raw` if it is an http:// or https:// URL with a host (and a valid port if one is given)."""
    text = str(raw).strip()
    if not text.lower().startswith(("http://", "https://")):
        raise ConfigError(f"{what}={raw!r}: expected a URL starting with http:// or https://")
    try:
        parts = urlsplit(text)
        parts.port   # raises ValueError on a port that is not a number in 0-65535
    except ValueError as exc:
        raise ConfigError(f"{what}={raw!r}: not a valid URL ({exc})") from None
    if not parts.hostname:
        raise ConfigError(f"{what}={raw!r}: the URL has no host")
    if any(c.isspace() for c in text):
        raise ConfigError(f"{what}={raw!r}: a URL cannot contain spaces")
    return text


SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("0", "false", "no", "off")


def switch(raw: str, what: str) -> bool:
    """An on/off setting: 1/true/yes/on or 0/false/no/off (any case)."""
    text = str(raw).strip().lower()
    if text in SWITCH_ON:
        return True
    if text in SWITCH_OFF:
        return False
    raise ConfigError(f"{what}={raw!r}: expected 1 or 0 (true/false, yes/no, on/off)")


def choice(raw: str, what: str, choices: tuple[str, ...]) -> str:
    """`raw` (stripped) if it is one of `choices`."""
    text = str(raw).strip()
    if text not in choices:
        raise ConfigError(f"{what}={raw!r}: expected {' or '.join(choices)}")
    return text


def name_text(raw: str, what: str) -> str:
    """A name (job, trial): one line of printable text, stripped."""
    text = str(raw).strip()
    if not text or not text.isprintable():
        raise ConfigError(f"{what}={raw!r}: expected a non-empty name without control characters")
    return text


def flag_type(parse: Callable[..., object], **kwargs) -> Callable[[str], object]:
    """An argparse `type=` from a parser above: argparse names the flag in its error line."""
    def convert(raw: str):
        try:
            return parse(raw, "value", **kwargs)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("value=", "", 1)) from None
    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def positive_float(**kwargs) -> Callable[[str], object]:
    """argparse type: a finite number > 0 (or within the given bounds)."""
    return flag_type(number, **({"lo": 0.0, "lo_open": True} | kwargs))


def bounded_int(lo: int, hi: float = INF) -> Callable[[str], object]:
    """argparse type: an integer within [lo, hi]."""
    return flag_type(number, lo=lo, hi=hi, kind=int)


def url_type() -> Callable[[str], object]:
    """argparse type: an http(s) URL with a host."""
    return flag_type(http_url)
