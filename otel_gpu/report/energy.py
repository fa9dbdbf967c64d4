"""The report's and the run summary's energy lines: J/step and J/token per GPU and for the job (energy.py)."""
from __future__ import annotations

from .. import energy as EN
from ..safe_text import html_text, visible


def table(rows: list[EN.Energy], job: EN.Energy) -> list[dict]:
    """Rows for the page: each group, then the job when there are several groups (or none)."""
    shown = rows + ([job] if len(rows) != 1 else [])
    return [{"label": r.label, "ranks": ", ".join(r.ranks) or "-",
             "j_per_step": EN.fmt(r.j_per_step, "J/step") if r.j_per_step is not None else r.why_step,
             "j_per_token": EN.fmt(r.j_per_token, "J/token") if r.j_per_token is not None else r.why_token,
             "joules": r.joules, "seconds": r.seconds, "steps": r.steps, "tokens": r.tokens, "resets": r.resets,
             "basis": r.basis} for r in shown]


def html(rows: list[dict]) -> str:
    """The energy section's table (text from the recording escaped)."""
    body = "".join(
        f"<tr><td>{html_text(r['label'])}</td><td>{html_text(r['ranks'])}</td><td>{html_text(r['j_per_step'])}</td>"
        f"<td>{html_text(r['j_per_token'])}</td><td>{_num(r['joules'], 'J')}</td><td>{_num(r['seconds'], 's')}</td>"
        f"<td>{html_text(_note(r))}</td></tr>" for r in rows)
    return ('<section id="sec-energy"><h2>Energy</h2>\n<table id="energy"><tr><th>GPU</th><th>ranks</th>'
            "<th>energy per step</th><th>energy per token</th><th>energy</th><th>over</th><th>basis</th></tr>"
            f"{body}</table>\n<p>NVML's energy counter between its first and last read during training "
            "(read every ~10 s or more: each read costs milliseconds), over the steps and tokens the ranks "
            "counted in the same interval; a drop in the counter (driver reload) counts as a reset.</p></section>")


def _num(value, unit: str) -> str:
    return "-" if value is None else f"{value:.4g} {unit}"


def _note(r: dict) -> str:
    resets = f"; {r['resets']} counter reset{'s' if r['resets'] != 1 else ''}" if r["resets"] else ""
    return (r["basis"] or "all GPUs over all tokens; per step: summed over GPUs") + resets


def summary_lines(rows: list[EN.Energy], job: EN.Energy) -> list[str]:
    """The run summary's energy lines (two spaces in, names shown `visible`)."""
    def one(r: EN.Energy) -> str:
        step = EN.fmt(r.j_per_step, "J/step") if r.j_per_step is not None else f"J/step {r.why_step}"
        token = EN.fmt(r.j_per_token, "J/token") if r.j_per_token is not None else f"J/token {r.why_token}"
        return f"  energy, {visible(r.label)}: {step}, {token}"
    return [one(r) for r in rows + ([job] if len(rows) > 1 else [])] if rows else [one(job)]
