"""Rendering a diagnosis: terminal text, Markdown, JSON (pure); files are written by `otel_gpu.output`."""
from __future__ import annotations

import json
import re
import textwrap

from . import fmt
from .. import words
from ..safe_text import markdown as md, visible
from .account import headline
from .mfu import mfu_pct
from .findings import Finding

MARK = {"critical": "CRITICAL", "warning": "warning", "info": "info"}


def header(d: dict) -> str:
    q = d["queries"]
    source = (f"recording {', '.join(q.get('dirs', []))} read in {d.get('seconds', 0):.2f} s"
              if q.get("source") == "recording" else
              f"{q.get('queries', 0)} PromQL queries in {q.get('query_seconds', 0):.2f} s")
    return (f"job {d['job'] or '(all)'}, {fmt.span(d['start'], d['end'], date=True)} ({fmt.secs(d['duration_s'])}): "
            f"{words.count(d['ranks'], 'rank')}, {words.count(d['gpus'], 'GPU')}, {words.count(d['nodes'], 'node')}; "
            f"{source}")


def _where(f: dict) -> str:
    """"ranks 0-7; nodes a, b" ("rank 3" for one)."""
    parts = [f"{k[:-1] if len(set(v)) == 1 and k.endswith('s') else k} {fmt.compact(v, 6)}"
             for k, v in f["where"].items() if v]
    return "; ".join(parts)


def _stake(f: dict, unit: str = "GPU") -> str:
    if f["missing"]:
        return "not checked"
    if f["lost_s"] > 0:
        share = f" = {fmt.pct(f['lost_share'])}" if f["lost_share"] is not None else ""
        return f"~{fmt.gpu_time(f['lost_s'], unit)}{share} at stake"
    return "no time estimate"


def _ranges(f: dict, limit: int = 4) -> str:
    rs = f["ranges"]
    if not rs:
        return ""
    shown = ", ".join(fmt.span(a, b) for a, b in rs[:limit])
    return shown + (f" and {len(rs) - limit} more" if len(rs) > limit else "")


def _unit(d: dict) -> str:
    """Time at stake in GPU-seconds with GPUs in the window, else rank-seconds."""
    return "GPU" if d.get("gpus") else "rank"


# a number and its unit stay on one line ("5.15 s", "12 GPU-min", "3.2 GiB")
_NUMBER_UNIT = re.compile(r"(?<=\d) (?=(?:ms|s|min|h|us|B|KiB|MiB|GiB|kB/s|MB/s|GB/s|W|C|MHz|(?:GPU|rank)-(?:s|min|h))\b)")


def _wrap(lead: str, body: str, width: int | None) -> list[str]:
    """``lead`` + ``body``, wrapped at ``width`` columns with the continuation lines under the body
    (a hanging indent; a number kept with its unit; a word longer than a line is cut); None: one line."""
    if width is None:
        return [lead + body]
    glued = _NUMBER_UNIT.sub("\xa0", body)
    lines = textwrap.wrap(glued, max(20, width - len(lead)), break_on_hyphens=False) or [""]
    return [(lead if i == 0 else " " * len(lead)) + line.replace("\xa0", " ") for i, line in enumerate(lines)]


def text(d: dict, width: int | None = None) -> str:
    """The diagnosis for the terminal; ``width``: wrap every line at that many columns (None: one
    line per item, for files and pipes that keep long lines)."""
    unit = _unit(d)
    lines = _wrap("otel-gpu diagnose: ", visible(header(d)), width)
    for n in d["notes"]:
        lines += _wrap("  note: ", visible(n), width)
    lines += _work_text(d.get("work") or {}, width)
    if not any(not f["missing"] for f in d["findings"]):
        lines.append("no bottleneck found above the thresholds")
    for i, f in enumerate(d["findings"], 1):
        lines.append("")
        sure = "" if f["missing"] else f"; confidence {f['confidence']}"   # not checked: nothing to be sure of
        lines += _wrap(f"{i}. ", f"[{MARK[f['severity']]}] {visible(f['title'])}  ({_stake(f, unit)}{sure})", width)
        lines += _wrap("   seen:  ", visible(f["seen"]), width)
        if not f["missing"]:
            lines += _wrap("   why:   ", visible(f["why"] + (f" [basis: {f['basis']}]" if f["basis"] else "")), width)
        lines += _wrap("   do:    ", visible(f["action"]), width)
        if f["where"]:
            lines += _wrap("   where: ", visible(_where(f)), width)
        if f["ranges"]:
            lines += _wrap("   when:  ", _ranges(f), width)
        if f["tune_space"]:
            lines += _wrap("   tune space: ", json.dumps(f["tune_space"]), width)
    return "\n".join(lines) + "\n"


def markdown(d: dict) -> str:
    """The diagnosis as Markdown; every text from the data escaped (safe_text.markdown): no raw HTML,
    no cell broken by a "|"."""
    out = [f"# otel-gpu diagnosis: {md(d['job'] or 'all jobs')}", "", md(header(d)), ""]
    out += [f"> {md(n)}" for n in d["notes"]]
    real = [f for f in d["findings"] if not f["missing"]]
    out += ["| # | severity | finding | at stake | confidence |", "|---|---|---|---|---|"]
    for i, f in enumerate(real, 1):
        out.append(f"| {i} | {f['severity']} | {md(f['title'])} | {md(_stake(f, _unit(d)))} | {f['confidence']} |")
    if not real:
        out.append("| - | - | no bottleneck found above the thresholds | - | - |")
    for i, f in enumerate(real, 1):
        out += ["", f"## {i}. {md(f['title'])}", "", f"- **seen:** {md(f['seen'])}",
                f"- **why it matters:** {md(f['why'])}"]
        if f["basis"]:
            out.append(f"- **estimate basis:** {md(f['basis'])}")
        out.append(f"- **next:** {md(f['action'])}")
        if f["where"]:
            out.append(f"- **where:** {md(_where(f))}")
        if f["ranges"]:
            out.append(f"- **when:** {md(_ranges(f, 10))}")
        if f["tune_space"]:   # a "`" in a value could end the fence: JSON's own escape instead
            out += ["", "Suggested `otel-gpu tune` space:", "", "```json",
                    json.dumps(f["tune_space"], indent=1).replace("`", "\\u0060"), "```"]
    out += _work_markdown(d.get("work") or {})
    missing = [f for f in d["findings"] if f["missing"]]
    if missing:
        out += ["", "## Not checked", ""] + [f"- {md(f['title'])}" for f in missing]
    return "\n".join(out) + "\n"


def _work_head(wk: dict) -> str:
    return headline(wk["job"])


def _work_text(wk: dict, width: int | None) -> list[str]:
    """The job's work and where its time went (account.py), for the terminal."""
    if not wk:
        return []
    lines = _wrap("  work: ", visible(_work_head(wk)), width)
    for line in wk["lines"]:
        note = line.startswith("note: ")
        lines += _wrap("  note: " if note else "  time: ", visible(line[len("note: "):] if note else line), width)
    return lines


def _work_markdown(wk: dict) -> list[str]:
    if not wk:
        return []
    acc = wk["account"]
    out = ["", "## Work and where the time went", "", f"- **work:** {md(_work_head(wk))}"]
    if wk["job"]["basis"]:
        out.append(f"- **MFU basis:** {md(wk['job']['basis'])}")
    if acc["why_not"]:
        return out + [f"- {md(acc['why_not'])}"]
    out += ["", "| part | share of wall time | basis |", "|---|---|---|"]
    out += [f"| {md(p['label'])} | {(mfu_pct if p['key'] == 'mfu' else fmt.pct)(p['share'])} | {md(p['basis'])} |"
            for p in acc["parts"]]
    return out + [f"- note: {md(n)}" for n in acc["notes"]]


def findings_from_dicts(rows: list[dict]) -> list[Finding]:
    """The inverse of `Finding.as_dict` (for scripts reading the JSON back)."""
    return [Finding(**{**r, "ranges": [tuple(x) for x in r["ranges"]]}) for r in rows]
