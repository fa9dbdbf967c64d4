"""Every query a generated dashboard will run, and the label selectors in them (pure functions).

Used by the tests that evaluate each panel, variable and annotation query against a real
PromQL server, and by `otel-gpu dashboards --list-queries`.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Iterator, Mapping

from .panels import PROMETHEUS_UID, PYROSCOPE_UID


@dataclass(frozen=True)
class Query:
    dashboard: str      # dashboard uid
    where: str          # "panel <title> <refId>", "variable <name>", "annotation <name>"
    kind: str           # "promql" | "label_values" | "query_result" | "profile" | "grafana_tags"
    expr: str           # PromQL, the label_values selector, a Pyroscope label selector, or tags
    label: str = ""     # label_values: the label whose values are listed
    instant: bool = False
    time_shift: str = ""  # panel time shift (flame graph comparisons)


def _panels(panels) -> Iterator[dict]:
    for p in panels or ():
        yield p
        yield from _panels(p.get("panels"))


def _uid(ds) -> str | None:
    return ds.get("uid") if isinstance(ds, dict) else None


def parse_variable_query(query: str) -> tuple[str, str, str]:
    """Grafana's Prometheus variable query -> (kind, expr, label).

    `label_values(sel, label)` -> ("label_values", sel, label); `label_values(label)` ->
    ("label_values", "", label); `query_result(expr)` -> ("query_result", expr, "").
    """
    q = query.strip()
    m = re.fullmatch(r"label_values\((.*)\)", q, re.S)
    if m:
        inner = m.group(1).strip()
        selector, comma, label = inner.rpartition(",")
        if not comma:
            return "label_values", "", inner
        return "label_values", selector.strip(), label.strip()
    m = re.fullmatch(r"query_result\((.*)\)", q, re.S)
    if m:
        return "query_result", m.group(1).strip(), ""
    raise ValueError(f"unsupported variable query: {query!r}")


def queries(dash: Mapping) -> list[Query]:
    """Every Prometheus and Pyroscope query of one dashboard's JSON."""
    uid = dash.get("uid") or dash.get("title", "?")
    out: list[Query] = []
    for panel in _panels(dash.get("panels")):
        for t in panel.get("targets") or ():
            ds = _uid(t.get("datasource")) or _uid(panel.get("datasource"))
            where = f"panel {panel.get('title')!r} {t.get('refId')}"
            if ds == PROMETHEUS_UID:
                out.append(Query(uid, where, "promql", t["expr"], instant=bool(t.get("instant"))))
            elif ds == PYROSCOPE_UID:
                out.append(Query(uid, where, "profile", t["labelSelector"], time_shift=panel.get("timeShift") or ""))
            else:
                raise ValueError(f"{uid}: {where}: unknown datasource {ds!r}")
    for var in (dash.get("templating") or {}).get("list") or ():
        if var.get("type") != "query":
            continue
        if _uid(var.get("datasource")) != PROMETHEUS_UID:
            raise ValueError(f"{uid}: variable {var.get('name')}: unknown datasource")
        kind, expr, label = parse_variable_query(var["query"])
        out.append(Query(uid, f"variable {var['name']}", kind, expr, label))
    for ann in (dash.get("annotations") or {}).get("list") or ():
        if ann.get("builtIn"):
            continue
        if (ann.get("target") or {}).get("type") == "tags" and _uid(ann.get("datasource")) == "-- Grafana --":
            out.append(Query(uid, f"annotation {ann['name']!r}", "grafana_tags", ",".join(ann["target"]["tags"])))
            continue
        if _uid(ann.get("datasource")) != PROMETHEUS_UID:
            raise ValueError(f"{uid}: annotation {ann.get('name')}: unknown datasource")
        out.append(Query(uid, f"annotation {ann['name']!r}", "promql", ann["expr"]))
    return out


def variable_names(dash: Mapping) -> set[str]:
    return {v["name"] for v in (dash.get("templating") or {}).get("list") or ()}


# Grafana's forms: $name, ${name}, ${name:format}, [[name]]
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def used_variables(text: str) -> set[str]:
    return {a or b or c for a, b, c in _VAR.findall(text)}


_MATCHER = re.compile(r'\s*([A-Za-z_][\w.]*)\s*(=~|!~|!=|=)\s*')
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def _string(text: str, pos: int) -> tuple[str, int]:
    """A PromQL string literal at `pos` -> (its value, the position after it).

    As Prometheus' lexer reads them (and Pyroscope, which uses it): backquoted strings are raw;
    in "..." and '...' a backslash starts one of Go's escapes (\\n, \\\\, the quote, \\u00e9,
    \\x41 and octal \\101 for bytes); any other (`\\.`) is an error, as is invalid UTF-8.
    """
    quote = text[pos:pos + 1]
    if quote not in ('"', "'", "`"):
        raise ValueError(f"expected a quoted string at {text[pos:]!r}")
    out, i = bytearray(), pos + 1
    while i < len(text):
        c = text[i]
        if c == quote:
            try:
                return out.decode("utf-8"), i + 1
            except UnicodeDecodeError:
                raise ValueError(f"invalid UTF-8 in {text!r}") from None
        if c != "\\" or quote == "`":
            out += c.encode("utf-8", "surrogatepass")
            i += 1
            continue
        e = text[i + 1:i + 2]
        if e in _SIMPLE_ESCAPES or e == quote:
            out += _SIMPLE_ESCAPES.get(e, e).encode()
            i += 2
            continue
        if e in ("x", "u", "U"):
            start, n, digits = i + 2, {"x": 2, "u": 4, "U": 8}[e], string.hexdigits
        elif e and e in string.octdigits:
            start, n, digits = i + 1, 3, string.octdigits
        else:
            raise ValueError(f"unknown escape sequence {text[i:i + 2]!r} in {text!r}")
        code = text[start:start + n]
        if len(code) != n or any(ch not in digits for ch in code):
            raise ValueError(f"bad escape {text[i:start + n]!r} in {text!r}")
        number = int(code, 8 if digits is string.octdigits else 16)
        if e in ("u", "U"):          # a code point
            if 0xD800 <= number <= 0xDFFF or number > 0x10FFFF:
                raise ValueError(f"invalid code point {text[i:start + n]!r} in {text!r}")
            out += chr(number).encode()
        elif number > 0xFF:
            raise ValueError(f"octal escape above 255 {text[i:start + n]!r} in {text!r}")
        else:                        # \\x and octal: one byte
            out.append(number)
        i = start + n
    raise ValueError(f"unterminated string in {text!r}")


def parse_selector(selector: str) -> list[tuple[str, str, str]]:
    """`{a="x", b=~`y.*`}` -> [(label, op, value), ...] (Pyroscope / PromQL selector syntax)."""
    s = selector.strip()
    if not (s.startswith("{") and s.endswith("}")):
        raise ValueError(f"not a label selector: {selector!r}")
    body, out, pos = s[1:-1], [], 0
    while body[pos:].strip():
        m = _MATCHER.match(body, pos)
        if not m:
            raise ValueError(f"bad matcher at {body[pos:]!r} in {selector!r}")
        value, pos = _string(body, m.end())
        out.append((m.group(1), m.group(2), value))
        rest = body[pos:].lstrip()
        pos = len(body) - len(rest)
        if rest:
            if rest[0] != ",":
                raise ValueError(f"expected ',' at {rest!r} in {selector!r}")
            pos += 1
    return out


def matches(matchers: list[tuple[str, str, str]], labels: Mapping[str, str]) -> bool:
    """Does a series with `labels` satisfy every matcher (absent label = empty string)?"""
    for name, op, value in matchers:
        got = labels.get(name, "")
        if op == "=" and got != value or op == "!=" and got == value:
            return False
        if op in ("=~", "!~") and (re.fullmatch(value, got) is not None) != (op == "=~"):
            return False
    return True
