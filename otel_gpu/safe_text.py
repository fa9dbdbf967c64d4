"""Text that came from data, made safe for where a person sees it (pure functions).

Names in recordings, traces, /proc and /sys trees, trial logs and the environment are untrusted:
any of them can hold terminal control sequences, markup or HTML. One rule per place it is shown:

- a terminal: `visible` shows every character a terminal would act on or hide as its Python
  escape: C0 and C1 controls (ESC, CR, newline, tab, BEL), DEL, bidi overrides and the other
  format characters, line and paragraph separators, lone surrogates, spaces other than " ",
  private-use and unassigned code points (``"\\x1b]0;x\\x07"`` is shown as ``\\x1b]0;x\\x07``).
  What it returns is printable (``str.isprintable``), so `visible` applied twice changes nothing
  and text without a backslash can be read back exactly (the escapes are Python's).
  `markup`: the same for a name placed in a rich markup string (``[bold]`` shown, not obeyed).
- an HTML page: `html_text` for element text and attribute values; `script_json` for data inlined
  in a ``<script>`` element (valid JSON for any input; ``json.loads`` gives the value back).
- Markdown: `markdown` for a name in a heading, a list item or a table cell (no raw HTML, no
  emphasis, links or cell breaks; shown as `visible` shows it).
- `no_surrogates`: lone surrogates (JSON's ``"\\udc80"``) as their escape, for text that must be
  encodable as UTF-8 (files, CSV) but otherwise kept as it is.
"""
from __future__ import annotations

import json
import re

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    short = _SHORT.get(ch)
    if short is not None:
        return short
    n = ord(ch)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def visible(s: str) -> str:
    """``s`` with every character that is not printable (see the module's doc) shown as its escape."""
    if not isinstance(s, str):
        s = str(s)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in s)


def markup(s: str) -> str:
    """A name for a rich markup string: `visible`, then rich's markup escaped."""
    from rich.markup import escape

    return escape(visible(s))


def html_text(s: str) -> str:
    """A name for HTML element text or a quoted attribute value: `visible`, then ``& < > " '`` escaped."""
    import html   # (not at import: the node agent imports this module and keeps its memory small)

    return html.escape(visible(s), quote=True)


_SCRIPT_UNSAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                  0x2028: "\\u2028", 0x2029: "\\u2029"}


def script_json(data) -> str:
    """``data`` as JSON text that can be inlined in a ``<script>`` element whatever its strings hold:
    no ``<``, ``>`` or ``&`` (no ``</script``, ``<!--``), ASCII only (lone surrogates escaped).
    ValueError for NaN or infinity (not JSON)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=True)
    return text.translate(_SCRIPT_UNSAFE)   # outside strings JSON has none of these characters


# what may start Markdown syntax inside a line (CommonMark escapes any ASCII punctuation with "\")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]#|~!])")
_HTML_SPECIAL = {ord("&"): "&amp;", ord("<"): "&lt;", ord(">"): "&gt;"}


def markdown(s: str) -> str:
    """A name for Markdown text (a heading, a list item, a table cell): `visible`, Markdown's inline
    syntax backslash-escaped, ``& < >`` as entities (never a raw tag); rendered, it reads as `visible`."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", visible(s)).translate(_HTML_SPECIAL)


_SURROGATE = re.compile("[\ud800-\udfff]")


def no_surrogates(s: str) -> str:
    """``s`` with each lone surrogate (not encodable as UTF-8) shown as its escape (``\\udc80``)."""
    return _SURROGATE.sub(lambda m: _escape(m.group()), s) if _SURROGATE.search(s) else s
