"""Renders the chart's templates for tests where no helm binary can be had (Debian ships none).

Only the template actions the chart uses are understood: `{{ .Values.a.b }}`, `{{ X | quote }}`,
`{{ toYaml X | nindent N }}`, `{{ .Release.Namespace }}`, `{{ .Chart.AppVersion }}`, `{{ if X }}` /
`{{ end }}`, with `{{-` trimming the whitespace before it as Go templates do. Anything else raises, so
the chart cannot grow a construct these tests do not render. Not helm: what helm adds (its own
checks, `required`, hooks, release metadata) is not exercised.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


class TemplateError(ValueError):
    """A template action this renderer does not understand."""


def _lookup(expr: str, ctx: dict):
    if not expr.startswith("."):
        raise TemplateError(f"not a field reference: {expr!r}")
    value = ctx
    for part in expr[1:].split("."):
        if not isinstance(value, dict) or part not in value:
            raise TemplateError(f"{expr} is not set")
        value = value[part]
    return value


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _action(body: str, ctx: dict) -> str:
    m = re.fullmatch(r"toYaml (\S+) \| nindent (\d+)", body)
    if m:
        dumped = yaml.safe_dump(_lookup(m.group(1), ctx), default_flow_style=False, sort_keys=True).rstrip("\n")
        pad = " " * int(m.group(2))
        return "\n" + "\n".join(pad + line for line in dumped.splitlines())
    m = re.fullmatch(r"(\S+) \| quote", body)
    if m:
        return '"' + _text(_lookup(m.group(1), ctx)).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if re.fullmatch(r"\.[A-Za-z][\w.]*", body):
        return _text(_lookup(body, ctx))
    raise TemplateError(f"unsupported action {{{{ {body} }}}}")


def render_text(text: str, ctx: dict) -> str:
    out: list[str] = []
    live = [True]   # are we emitting (the stack of `if`s)?
    pos = 0
    for m in ACTION.finditer(text):
        if live[-1]:
            out.append(text[pos:m.start()])
        if m.group(1):   # `{{-`: trim the whitespace before
            while out and not out[-1].strip(" \t\n"):
                out.pop()
            if out:
                out[-1] = out[-1].rstrip(" \t\n")
        body = m.group(2)
        if m.group(3):
            raise TemplateError("`-}}` is not used by the chart")
        if body.startswith("if "):
            value = _lookup(body[3:].strip(), ctx) if live[-1] else None
            live.append(live[-1] and bool(value))
        elif body == "end":
            if len(live) == 1:
                raise TemplateError("`end` without `if`")
            live.pop()
        elif live[-1]:
            out.append(_action(body, ctx))
        pos = m.end()
    if len(live) != 1:
        raise TemplateError("`if` without `end`")
    out.append(text[pos:])
    return "".join(out)


def deep_merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render_chart(chart: Path, namespace: str, values: dict | None = None) -> list[dict]:
    """Every object the chart's templates render with its values.yaml, `values` merged on top."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    ctx = {"Values": deep_merge(yaml.safe_load((chart / "values.yaml").read_text()), values or {}),
           "Release": {"Namespace": namespace, "Name": meta["name"]},
           "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta["appVersion"]}}
    docs = []
    for template in sorted((chart / "templates").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(render_text(template.read_text(), ctx)) if d]
    return docs
