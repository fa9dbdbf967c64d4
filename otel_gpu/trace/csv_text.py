"""CSV text of result tables (lists of dicts), byte for byte what ``csv.DictWriter`` writes (minimal
quoting, ``\\n`` line ends) of the rows made JSON-clean, only faster: each distinct string is quoted
once (op and kernel names repeat across the ranks), numbers are written as the csv module writes
them (``repr`` of a float, ``str`` of an int), and rows are joined without a writer call each."""
from __future__ import annotations

import csv
import io
import json
import math

import numpy as np

_PLAIN = (str, int, bool, type(None))


def json_value(x):
    """``x`` made JSON-clean: private (``_``) keys left out of dicts, NaN and infinities as None,
    numpy scalars as Python numbers."""
    t = type(x)
    if t in _PLAIN:
        return x
    if t is float:
        return x if math.isfinite(x) else None
    if t is dict:
        return {k: json_value(v) for k, v in x.items()
                if not (k[:1] == "_" if type(k) is str else str(k).startswith("_"))}
    if t is list or t is tuple:
        return [json_value(v) for v in x]
    if isinstance(x, dict):
        return {k: json_value(v) for k, v in x.items() if not str(k).startswith("_")}
    if isinstance(x, (list, tuple)):
        return [json_value(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return None if np.isnan(x) or np.isinf(x) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def cell(v):
    """One value as the table's CSV holds it: JSON-clean (``json_value``), a dict or list as its
    JSON text, NaN and infinities as None (an empty field)."""
    t = type(v)
    if t is str or t is int:
        return v
    if t is float:
        return v if math.isfinite(v) else None
    v = json_value(v)
    return json.dumps(v) if isinstance(v, (dict, list)) else v


_QUOTED: dict[str, str] = {"": ""}   # a string -> its field text (ranks repeat op and kernel names)
_QUOTED_MAX = 1 << 14   # strings remembered at most (then forgotten and remembered anew)
_QUOTED_LEN = 512   # longer strings (JSON cells, rare long names) are quoted each time, not remembered


def field_writer():
    """A function giving a value's field text in a row of several fields, as ``csv.writer`` writes
    it; a string's quoted form is computed by the csv module once and remembered (for the process:
    every rank's tables name the same ops and kernels; at most ``_QUOTED_MAX`` strings of up to
    ``_QUOTED_LEN`` characters)."""
    quoted = _QUOTED
    one = io.StringIO()
    w1 = csv.writer(one, lineterminator="\n")

    def quote(v: str) -> str:
        one.seek(0)
        one.truncate()
        w1.writerow([v])
        return one.getvalue()[:-1]

    def text(v) -> str:
        t = type(v)
        if t is str:
            f = quoted.get(v)
            if f is None:
                f = quote(v)
                if len(v) <= _QUOTED_LEN:
                    if len(quoted) >= _QUOTED_MAX:
                        quoted.clear()
                        quoted[""] = ""
                    quoted[v] = f
            return f
        if t is int or t is bool:
            return str(v)
        if t is float:
            return repr(v) if math.isfinite(v) else ""
        if v is None:
            return ""
        v = cell(v)   # numpy scalars, dicts, lists, other objects: as the csv module would write them
        t = type(v)
        if t is str:   # a JSON text made for this row: quoted, not remembered (it will not come again)
            return quote(v)
        return text(v if t is float or t is int or t is bool or v is None else str(v))
    return text


def columns(rows: list[dict]) -> list:
    """Every key of the rows in first-seen order, private (``_``) keys left out."""
    seen: dict = {}
    for r in rows:
        seen.update(r)   # an existing key keeps its place
    return [k for k in seen if not str(k).startswith("_")]


def header_text(cols: list) -> str:
    """The header line ``csv_pieces`` writes for ``cols``."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cols)
    return buf.getvalue()


def joined_pieces(parts: list[tuple[list, object]], text_of):
    """``csv_pieces`` of the rows of several parts made apart, one piece a part: ``parts`` holds,
    in order, (``columns`` of a part's rows, its ``rows_text`` in any form) and ``text_of`` turns
    that form into the text. None when the parts' columns differ (or are fewer than two): their
    lines cannot then simply be joined."""
    cols = [c for c, _ in parts if c]
    if any(c != cols[0] for c in cols) or (cols and len(cols[0]) < 2):
        return None

    def pieces():
        yield header_text(cols[0]) if cols else ""
        for c, packed in parts:
            if c:
                yield text_of(packed)
    return pieces()


def rows_text(rows: list[dict], cols: list) -> str:
    """The CSV lines of ``rows`` under the columns ``cols`` (at least two; no header), as
    ``csv_pieces`` writes them."""
    text = field_writer()
    return "".join([",".join([text(r.get(k, "")) for k in cols]) + "\n" for r in rows])


def csv_pieces(rows: list[dict], size: int = 1 << 16):
    """CSV of ``rows`` in pieces of about ``size`` characters (only one in memory at a time): a
    header of ``columns(rows)``, then a line per row, an absent key an empty field."""
    buf = io.StringIO()
    if rows:
        cols = columns(rows)
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        write, tell = buf.write, buf.tell
        if len(cols) == 1:   # a lone empty field is written "" by the csv module: leave it to it
            for r in rows:
                w.writerow([cell(r.get(k, "")) for k in cols])
                if tell() >= size:
                    yield buf.getvalue()
                    buf.seek(0)
                    buf.truncate()
        else:
            text = field_writer()
            for r in rows:
                get = r.get
                write(",".join([text(get(k, "")) for k in cols]) + "\n")
                if tell() >= size:
                    yield buf.getvalue()
                    buf.seek(0)
                    buf.truncate()
    yield buf.getvalue()
