"""Grafana's template-variable interpolation, as Grafana 11.6 applies it per datasource (pure functions).

What a query looks like after Grafana replaced `$var`, `${var}`, `${var:format}` and `[[var]]`:

- The selected value: one string, a list (a multi-value variable), or "All". "All" is the
  variable's `allValue` when it has one, put in as it is, never escaped or formatted (scenes'
  `CustomAllValue`); without one it is the list of all the variable's options.
- An explicit format (`${var:regex}`, `:pipe`, `:glob`, `:raw`) is Grafana's format registry:
  `regex` escapes each value (`escapeRegex`: a backslash before each of ``\\^$*+?.()|[]{}/``) and
  joins several as `(a|b)`; `pipe` joins them with `|` unescaped; `glob` gives `{a,b}`.
- Without a format the datasource decides. Prometheus (`interpolateQueryExpr`): a variable that
  is neither multi nor "All" only has `\\` and `'` escaped; otherwise each value is regex-escaped
  for a PromQL string (two backslashes before a metacharacter) and several become `(a|b)`.
  Pyroscope (`applyTemplateVariables` calls `templateSrv.replace` with no format): the
  default, glob, so two nodes become `{a,b}`, a regex that matches neither (Grafana issue 108914).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

ALL = "$__all"                      # the selection "All"
Selection = Union[str, Sequence[str]]

PROMETHEUS, PYROSCOPE = "prometheus", "grafana-pyroscope-datasource"

# Grafana's variable syntax: $name, [[name]], [[name:format]], ${name}, ${name:format}
VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?::([^}]+))?\}")


@dataclass(frozen=True)
class Variable:
    name: str
    multi: bool = False
    include_all: bool = False
    all_value: str | None = None      # None or "": "All" is every option

    @classmethod
    def from_json(cls, var: Mapping) -> "Variable":
        return cls(var["name"], bool(var.get("multi")), bool(var.get("includeAll")), var.get("allValue") or None)


def variables(dash: Mapping) -> dict[str, Variable]:
    return {v["name"]: Variable.from_json(v) for v in (dash.get("templating") or {}).get("list") or ()}


class _Raw(str):
    """An "All" custom value: inserted as it is, whatever the format."""


def _value(var: Variable, selection: Selection, options: Sequence[str]):
    if selection == ALL or (not isinstance(selection, str) and list(selection) == [ALL]):
        if not var.include_all:
            raise ValueError(f"${var.name} has no All option")
        return _Raw(var.all_value) if var.all_value else list(options)
    if isinstance(selection, str):
        return [selection] if var.multi else selection
    if not var.multi and len(selection) != 1:
        raise ValueError(f"${var.name} is not multi-value: {list(selection)!r}")
    return list(selection) if var.multi else selection[0]


def escape_regex(value: str) -> str:
    """@grafana/data `escapeRegex`."""
    return re.sub(r"[\\^$*+?.()|\[\]{}/]", lambda m: "\\" + m.group(0), value)


def prometheus_regex_escape(value: str) -> str:
    """Grafana's `prometheusSpecialRegexEscape`: a regex escape inside a PromQL string literal."""
    return re.sub(r"[$^*{}\[\]+?.()|]", lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def prometheus_regular_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


def _join(values, escape, single, several) -> str:
    if isinstance(values, str):
        return escape(values)
    escaped = [escape(v) for v in values]
    return single(escaped[0]) if len(escaped) == 1 else several(escaped)


FORMATS = {
    "regex": lambda v: _join(v, escape_regex, str, lambda e: "(" + "|".join(e) + ")"),
    "pipe": lambda v: _join(v, str, str, "|".join),
    "glob": lambda v: _join(v, str, str, lambda e: "{" + ",".join(e) + "}"),
    "raw": lambda v: _join(v, str, str, ",".join),
    "csv": lambda v: _join(v, str, str, ",".join),
}


def _prometheus_default(var: Variable, value) -> str:
    if not var.multi and not var.include_all:
        return prometheus_regular_escape(value if isinstance(value, str) else value[0])
    return _join(value, prometheus_regex_escape, str, lambda e: "(" + "|".join(e) + ")")


def format_value(var: Variable, selection: Selection, options: Sequence[str], fmt: str | None,
                 datasource: str) -> str:
    """The text Grafana puts in place of one variable reference."""
    value = _value(var, selection, options)
    if isinstance(value, _Raw):
        return str(value)
    if fmt is None:
        if datasource == PROMETHEUS:
            return _prometheus_default(var, value)
        fmt = "glob"
    if fmt not in FORMATS:
        raise ValueError(f"${{{var.name}:{fmt}}}: format not modelled here")
    return FORMATS[fmt](value)


def interpolate(text: str, datasource: str, dash_vars: Mapping[str, Variable],
                selections: Mapping[str, Selection], options: Mapping[str, Sequence[str]],
                builtins: Mapping[str, str] | None = None) -> str:
    """`text` with every variable replaced as Grafana does for `datasource`.

    `builtins` (`__rate_interval`, `__interval` ...) are put in as they are; an unknown
    variable is a KeyError naming it.
    """
    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(5)
        if builtins and name in builtins:
            return builtins[name]
        if name not in dash_vars or name not in selections:
            raise KeyError(f"no value for template variable ${name} in {text!r}")
        return format_value(dash_vars[name], selections[name], options.get(name, ()), fmt, datasource)
    return VARIABLE.sub(repl, text)
