"""A rule file as YAML text without PyYAML (pure): block mappings and lists, strings double-quoted
in ASCII with YAML's escapes, multi-line strings as literal blocks, so a PromQL expression reads as
written. Only what rule files hold: dicts, lists, str, int, float."""
from __future__ import annotations

import re

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*|(?:[0-9]+(?:ms|[smhdwy]))+")   # names, durations
_NOT_PLAIN = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


def scalar(value) -> str:
    if isinstance(value, bool) or value is None:
        raise TypeError(f"not a rule-file value: {value!r}")
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):   # YAML 1.1 reads `1e-05` as text: a float needs its dot
        mantissa, e, exp = repr(value).partition("e")
        return mantissa + (".0" if e and "." not in mantissa else "") + e + exp
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _NOT_PLAIN:
        return text
    return quoted(text)


def quoted(text: str) -> str:
    """A YAML double-quoted scalar in ASCII: `"` and `\\` escaped, everything outside printable ASCII as
    \\xXX, \\uXXXX or \\UXXXXXXXX (YAML refuses some characters raw: C0/C1 controls, U+FFFE)."""
    out = ['"']
    for ch in text:
        n = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= n < 0x7F:
            out.append(ch)
        elif n < 0x100:
            out.append(f"\\x{n:02x}")
        elif n < 0x10000:
            out.append(f"\\u{n:04x}")
        else:
            out.append(f"\\U{n:08x}")
    out.append('"')
    return "".join(out)


def _block(text: str, indent: int) -> list[str] | None:
    """A literal block (`|-`) when it reads back the same: several lines, none blank-padded or tabbed."""
    lines = text.split("\n")
    if len(lines) < 2 or any(line != line.rstrip() or not line or not line.isascii() or not line.isprintable()
                             for line in lines) or lines[0].startswith(" "):
        return None
    pad = " " * indent
    return [pad + line for line in lines]


def lines(obj, indent: int = 0) -> list[str]:
    """The YAML lines of a dict or list at `indent` spaces."""
    pad = " " * indent
    out: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            k = scalar(str(key))
            if isinstance(value, (dict, list)) and value:
                out.append(f"{pad}{k}:")
                out.extend(lines(value, indent + 2))
            elif isinstance(value, str) and (block := _block(value, indent + 2)) is not None:
                out.append(f"{pad}{k}: |-")
                out.extend(block)
            else:
                out.append(f"{pad}{k}: {_inline(value)}")
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, (dict, list)) and item:
                inner = lines(item, indent + 2)
                out.append(f"{pad}- {inner[0][indent + 2:]}")
                out.extend(inner[1:])
            else:
                out.append(f"{pad}- {_inline(item)}")
    else:
        raise TypeError(f"expected a dict or list, got {type(obj).__name__}")
    return out


def _inline(value) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return scalar(value)


def dump(obj, header: str = "") -> str:
    """`obj` as YAML text ending in a newline, after `header` (comment lines)."""
    return header + "\n".join(lines(obj)) + "\n"
