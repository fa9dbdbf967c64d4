"""The rules for text from data (otel_gpu.safe_text), for any string: the terminal form holds no
control or format character and reads back to the original; the inline-script JSON is valid, holds
no character that could end or comment out the script, and loads back to the same value; Markdown
renders to no tag of its own and reads as the terminal form."""
from __future__ import annotations

import html
import json
import re
import unicodedata

from hypothesis import example, given, settings, strategies as st
from markdown_it import MarkdownIt

from otel_gpu.safe_text import html_text, markdown, markup, no_surrogates, script_json, visible

# every code point, lone surrogates included (JSON and /proc can hold them)
ANY = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()))
NASTY = ["\x1b]0;pwned\x07", "\x1b[2J\x1b[31mred", "a\rb\nc", "\u202eevil\u202c", "\x9b31m", "\u2028\u2029",
         "\udc80", "<img src=x onerror=alert(1)>", "<!--", "</script><script>alert(1)</script>", "[bold]x[/bold]",
         "| a | b |", "*x* _y_ `z` [l](http://x) ![i](x)", "\\", "&amp;", "\x00\x7f\xa0\u200b\ufeff"]


def _unescape(s: str) -> str:
    """Python's escapes back to characters (for text that held no backslash)."""
    return re.sub(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|n|r|t)",
                  lambda m: {"n": "\n", "r": "\r", "t": "\t"}.get(m.group(1)) or chr(int(m.group(1)[1:], 16)), s)


def _shown_raw(ch: str) -> bool:
    hidden = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
    return unicodedata.category(ch) not in hidden and (ch == " " or not ch.isspace())


@settings(max_examples=400)
@given(ANY)
@example("".join(NASTY))
def test_the_terminal_form_holds_no_control_character_and_reads_back(s):
    shown = visible(s)
    assert shown.isprintable()
    assert all(_shown_raw(ch) for ch in shown)
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]", shown)
    shown.encode("utf-8")   # no lone surrogate left
    assert visible(shown) == shown   # applied twice (a formatter and its caller): no change
    if "\\" not in s:
        assert _unescape(shown) == s
    else:   # every character that is not shown raw is still there, escaped
        assert all(_shown_raw(ch) or repr(ch)[1:-1] in shown for ch in s)


@given(ANY)
@example("".join(NASTY))
def test_rich_markup_of_a_name_prints_the_name_as_it_is_shown(s):
    from rich.text import Text

    assert Text.from_markup(markup(s)).plain == visible(s)
    assert Text.from_markup(f"[bold]{markup(s)}[/bold] after").plain == visible(s) + " after"


@settings(max_examples=400)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | ANY,
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(ANY, kids, max_size=4), max_leaves=12))
@example({"job": "".join(NASTY), "names": NASTY})
def test_inline_script_json_is_valid_and_loads_back_to_the_same_value(data):
    text = script_json(data)
    assert json.loads(text) == data
    assert not set(text) & set("<>&\u2028\u2029")
    assert text.isascii()


@given(ANY)
@example("".join(NASTY))
def test_html_text_holds_no_markup(s):
    out = html_text(s)
    assert not set(out) & set("<>\"'") and html.unescape(out) == visible(s)


_MD = MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough")
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9]*)")


def _tags(rendered: str) -> list[str]:
    return [m.group(1) + m.group(2) for m in _TAG.finditer(rendered)]


@settings(max_examples=300)
@given(ANY)
@example("".join(NASTY))
@example("<img src=x onerror=alert(1)>")
def test_markdown_of_a_name_renders_as_text_with_no_tag_of_its_own(s):
    md = markdown(s)
    assert "<" not in md and ">" not in md and "\n" not in md
    as_text = _MD.render(f"x {md} y")
    assert _tags(as_text) == ["p", "/p"], as_text
    assert html.unescape(as_text[len("<p>x "):-len(" y</p>\n")]) == visible(s)
    heading = _MD.render(f"## 1. {md}")
    assert _tags(heading) == ["h2", "/h2"], heading
    table = _MD.render(f"| a | b |\n|---|---|\n| {md} | z |\n")
    assert _tags(table).count("td") == 2, table   # the cell was not split
    assert {t.lstrip("/") for t in _tags(table)} <= {"table", "thead", "tbody", "tr", "th", "td"}


@given(ANY)
def test_no_surrogates_keeps_every_other_character(s):
    out = no_surrogates(s)
    out.encode("utf-8")
    if not re.search("[\ud800-\udfff]", s):
        assert out == s


_LAYOUT_OK = re.compile("[^\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]*")   # newlines only


def _only_layout_newlines(out: str) -> None:
    assert _LAYOUT_OK.fullmatch(out), repr(out)
    assert all(line.isprintable() for line in out.split("\n"))


@settings(max_examples=60, deadline=None)
@given(ANY, ANY, ANY, st.sampled_from([None, 40, 100]))
@example("", "", "²", None)   # a digit that is not ASCII in a name sorted naturally (int('²') fails)
def test_a_diagnosis_in_the_terminal_holds_no_control_character_but_its_newlines(job, title, seen, width):
    from otel_gpu.diagnose import report

    finding = {"missing": [], "confidence": "high", "severity": "critical", "title": title, "seen": seen,
               "why": seen, "basis": title, "action": title, "where": {"ranks": [job, "1"], "nodes": [seen]},
               "ranges": [(0.0, 10.0)], "tune_space": {title: [1, 2]}, "lost_s": 5.0, "lost_share": 0.5}
    d = {"job": job, "queries": {"source": "recording", "dirs": [seen]}, "seconds": 0.1, "start": 0.0, "end": 10.0,
         "duration_s": 10.0, "ranks": 2, "gpus": 1, "nodes": 1, "notes": [title], "findings": [finding]}
    out = report.text(d, width)
    _only_layout_newlines(out)
    md = report.markdown(d)
    _only_layout_newlines(md)
    allowed = {"h1", "h2", "p", "blockquote", "table", "thead", "tbody", "tr", "th", "td", "ul", "li", "strong", "pre",
               "code"}
    assert {t.lstrip("/") for t in _tags(_MD.render(md))} <= allowed


@settings(max_examples=60, deadline=None)
@given(st.lists(ANY, min_size=1, max_size=3), st.integers(20, 120))
def test_tables_and_paragraphs_in_the_terminal_hold_no_control_character_but_their_newlines(cells, width):
    from io import StringIO

    from rich.console import Console

    from otel_gpu.terminal import Col, FitTable, hang

    buf = StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    con.print(FitTable(cells[0], [Col(c, text=True) for c in cells], [cells, cells[::-1]]))
    hang(con, cells[-1], " ".join(cells))
    hang(con, "[bold]x[/bold] ", markup(cells[0]), markup=True)
    _only_layout_newlines(buf.getvalue())
