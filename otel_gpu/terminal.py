"""Terminal output that fits the terminal it is printed on.

The width is rich's own detection: the terminal's size, else the ``COLUMNS`` variable, else 80
columns (a pipe or a file). Tables keep their columns whole and readable: a name column folds
(down to ``TEXT_MIN`` characters), a number never wraps, and when the columns still do not fit,
those of least priority are left out, and a line under the table says which.

Every text a table or a hanging paragraph shows passes `safe_text.visible` here: a name from data
never moves the cursor, sets a title or colours the terminal.
"""
from __future__ import annotations

import os
import re
import sys
import textwrap
from dataclasses import dataclass
from typing import Sequence

from .safe_text import visible

TEXT_MIN = 20          # a name column folds, but never narrower than this (characters)
TEXT_COMFORT = 40      # names fold down to this width before headers wrap
CELL_EXTRA = 3         # rich's default box: a rule and one space of padding each side per column
EDGE_EXTRA = 1         # the closing rule on the right


@dataclass(frozen=True)
class Col:
    """A table column: its header, priority (0: always kept; higher: left out first) and kind."""
    header: str
    priority: int = 0
    text: bool = False     # a name: left-aligned and folded; else right-aligned (a number), never wrapped
    left: bool = False     # a short label (a rank, a category): left-aligned, never wrapped


def console(file=None, **kw):
    """A rich Console on ``file`` (default the current stdout) at the width rich detects."""
    from rich.console import Console

    return Console(file=file or sys.stdout, highlight=False, **kw)


def wrap_width(file=None) -> int | None:
    """The width to wrap plain text lines at: the terminal's (rich's detection) when ``file``
    (default stdout) is a terminal or ``COLUMNS`` is set; None for a pipe or a file, whose
    readers (grep, scripts) get one line per item."""
    f = file or sys.stdout
    try:
        tty = f.isatty()
    except (AttributeError, ValueError):
        tty = False
    return console(f).width if tty or os.environ.get("COLUMNS", "").strip() else None


_LEAD = re.compile(r"\s*(?:\d+\.\s+(?:\[[a-z]+\]\s+)?|[a-z][a-z ]{0,20}:\s+)?", re.I)


def wrap_lines(text: str, width: int | None) -> str:
    """Each line of ``text`` wrapped at ``width`` columns under its own lead (its indent, a "1. "
    bullet, a "label: "), a word longer than the line (a path) left whole on a line of its own so it
    can be copied; None: ``text`` as it is."""
    if width is None:
        return text
    out: list[str] = []
    for line in text.splitlines():
        lead = _LEAD.match(line).group(0)
        if len(lead) > width // 2:
            lead = lead[:len(lead) - len(lead.lstrip())]   # a long label: hang under the indent only
        body = textwrap.wrap(line[len(lead):], max(20, width - len(lead)), break_long_words=False,
                             break_on_hyphens=False) or [""]
        out += [(lead if i == 0 else " " * len(lead)) + b for i, b in enumerate(body)]
    return "\n".join(out)


def _cell(s: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in s.splitlines()), default=0)


def min_width(col: Col, cells: Sequence[str]) -> int:
    """Columns a column needs: its widest header word, and its widest cell (a name: at most TEXT_MIN)."""
    head = max((_cell(w) for w in col.header.split()), default=0)
    widest = max((_cell(c) for c in cells), default=0)
    return max(head, min(widest, TEXT_MIN) if col.text else widest, 1)


def natural_width(col: Col, cells: Sequence[str]) -> int:
    """Columns a column takes unwrapped: its whole header or its widest cell."""
    return max(_cell(col.header), max((_cell(c) for c in cells), default=0), 1)


def fit_columns(width: int, cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> list[int]:
    """Indices of the columns kept (in order) so that the table's minimum width fits ``width``:
    the highest priority number is left out first, among equals the rightmost. Priority-0 columns
    are always kept (the table may then be wider than ``width``, never narrower than readable)."""
    need = {i: min_width(c, [r[i] for r in rows]) + CELL_EXTRA for i, c in enumerate(cols)}
    kept = list(range(len(cols)))
    order = sorted((i for i, c in enumerate(cols) if c.priority > 0), key=lambda i: (-cols[i].priority, -i))
    for i in order:
        if sum(need[k] for k in kept) + EDGE_EXTRA <= width:
            break
        kept.remove(i)
    return kept


def layout(width: int, cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> tuple[list[int], list[int]]:
    """(kept column indices, their content widths) for a table at most ``width`` columns wide where
    it can be: every column at its natural width, then names folded down to TEXT_COMFORT, then
    headers wrapped, then names folded further; the widest first, never below a column's minimum."""
    kept = fit_columns(width, cols, rows)
    cells = {i: [r[i] for r in rows] for i in kept}
    w = {i: natural_width(cols[i], cells[i]) for i in kept}
    low = {i: min_width(cols[i], cells[i]) for i in kept}
    excess = sum(w.values()) + CELL_EXTRA * len(kept) + EDGE_EXTRA - width
    names, numbers = [i for i in kept if cols[i].text], [i for i in kept if not cols[i].text]
    for group, floor in ((names, TEXT_COMFORT), (numbers, 0), (names, 0)):
        while excess > 0:
            slack = [i for i in group if w[i] > max(low[i], floor)]
            if not slack:
                break
            widest = max(slack, key=lambda i: (w[i], i))
            w[widest] -= 1
            excess -= 1
    return kept, [w[i] for i in kept]


class FitTable:
    """A rich renderable: the title on its own lines (`title_lines`), the table at the width it is rendered at,
    and a line naming the columns left out at that width (``note`` says where they are, e.g.
    "all in --csv"). Title, headers and cells are plain text, shown `visible`."""

    def __init__(self, title: str, cols: Sequence[Col], rows: Sequence[Sequence[str]], note: str = ""):
        self.title, self.note = visible(title), visible(note)
        self.cols = [Col(visible(c.header), c.priority, c.text, c.left) for c in cols]
        self.rows = [[visible(x) for x in r] for r in rows]

    def __rich_console__(self, con, options):
        from rich import box
        from rich.table import Table
        from rich.text import Text

        width = options.max_width
        kept, widths = layout(width, self.cols, self.rows)
        for line in title_lines(self.title, width):
            yield Text(line, style="bold", no_wrap=True, overflow="ignore")
        t = Table(box=box.HEAVY_HEAD, show_lines=False)
        for i, w in zip(kept, widths):
            c = self.cols[i]
            # a header wraps at its spaces, a name folds; a number is never narrower than itself
            t.add_column(Text(c.header), justify="left" if c.text or c.left else "right", overflow="fold", width=w)
        for r in self.rows:   # cells are plain text: a name holding "[...]" is shown as it is, never as markup
            t.add_row(*[Text(r[i]) for i in kept])
        yield t
        left = [self.cols[i].header for i in range(len(self.cols)) if i not in kept]
        if left:
            yield Text(f"  (left out at {width} columns: " + ", ".join(left) + (f"; {self.note}" if self.note else "")
                       + ")", style="dim", overflow="fold")


_PATH = re.compile(r"[/\\]")   # a word holding a path (or a URL): never cut, so that it can be copied


def break_offsets(plain: str, width: int) -> list[int]:
    """Where to cut ``plain`` (one line) into lines of at most ``width`` cells: before a word that
    would pass the width; a word longer than a line is folded, except a path (a word with ``/`` or
    ``\\``), which stays whole on a line of its own, longer than ``width``, so that it stays copyable."""
    from rich.cells import cell_len

    offsets: list[int] = []
    start, has_word = 0, False
    for m in re.finditer(r"\S+", plain):
        if has_word and cell_len(plain[start:m.end()]) > width:
            offsets.append(m.start())
            start = m.start()
        has_word = True
        if cell_len(plain[start:m.end()]) > width and not _PATH.search(m.group()):
            used = cell_len(plain[start:m.start()])
            for j in range(m.start(), m.end()):
                c = cell_len(plain[j])
                if used + c > width and j > start:
                    offsets.append(j)
                    start, used = j, 0
                used += c
    return offsets


def _phrases(text: str) -> list[str]:
    """``text`` cut after each "; " and ", " and before each " (": the places a title may wrap at."""
    return [p for p in re.split(r"(?<=[;,]) +| +(?=\()", text) if p]


def title_lines(title: str, width: int, indent: int = 2) -> list[str]:
    """A title that fits ``width`` cells, wrapped where it does not: between phrases (at "; ",
    ", ", before " ("), the continuation lines indented by ``indent``; a phrase longer than a line
    wraps at its spaces (``break_offsets``)."""
    from rich.cells import cell_len

    if cell_len(title) <= width:
        return [title]
    lines: list[str] = []
    cur = ""
    for phrase in _phrases(title):
        room = width - (indent if lines else 0)
        joined = f"{cur} {phrase}" if cur else phrase
        if cell_len(joined) <= room:
            cur = joined
            continue
        if cur:
            lines.append(cur)
        cur = phrase
        while cuts := break_offsets(cur, width - (indent if lines else 0)):
            lines.append(cur[:cuts[0]].rstrip())
            cur = cur[cuts[0]:]
    lines.append(cur)
    return [lines[0]] + [" " * indent + line for line in lines[1:]]


def hang(con, lead: str, text: str, markup: bool = False) -> None:
    """``lead`` then ``text`` (one paragraph) wrapped at the console's width, continuation lines under
    the text (a hanging indent; a path is never cut: see `break_offsets`); ``markup``: ``lead`` and
    ``text`` hold rich markup (names in it escaped with `safe_text.markup`). Both are shown `visible`:
    a newline or an escape sequence in a name is shown, not obeyed."""
    from rich.text import Text

    lead, text = visible(lead), visible(text)
    head = Text.from_markup(lead) if markup else Text(lead)
    pad = head.cell_len
    body = Text.from_markup(text) if markup else Text(text)
    first = True
    for para in body.split("\n", allow_blank=True):
        for line in para.divide(break_offsets(para.plain, max(20, con.width - pad))):
            line.rstrip()
            con.print(Text.assemble(head if first else " " * pad, line), no_wrap=True, overflow="ignore",
                      crop=False, soft_wrap=False)
            first = False
