"""The tuning report: every trial, its parameters, status, step time, change against the baseline,
the node-agent evidence over its steady window, and parameter importances (terminal and Markdown).

Built from the study storage alone, so any node (or a later `--report-only`) can write it.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import TrialState

from .. import output
from . import config as C
from .study import BASELINE

EVIDENCE_COLUMNS = (   # key, header, scale, format
    ("sm_activity", "SM activity", 100, "{:.0f}%"),
    ("gpu_utilization", "GPU util", 100, "{:.0f}%"),
    ("nvlink_bytes_per_s", "NVLink GiB/s", 1 / 2**30, "{:.2f}"),
    ("ib_bytes_per_s", "IB GiB/s", 1 / 2**30, "{:.2f}"),
    ("gpu_memory_peak_bytes", "GPU mem peak GiB", 1 / 2**30, "{:.1f}"),
)


@dataclass
class Row:
    number: int
    role: str
    status: str
    reason: str
    step_time_s: float | None
    seconds: float | None
    params: dict
    evidence: dict = field(default_factory=dict)
    vs_baseline: float | None = None       # fraction faster than the baseline (0.2 = 20% less step time)
    overhead_s: float | None = None


def rows(study: optuna.Study) -> list[Row]:
    out = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            continue
        a = t.user_attrs
        status = a.get("status") or ("running" if t.state == TrialState.RUNNING else t.state.name.lower())
        out.append(Row(t.number, a.get("role", "sampled"), status, a.get("reason", ""), a.get("step_time_s"),
                       a.get("seconds"), dict(t.params), a.get("evidence") or {}, overhead_s=a.get("overhead_s")))
    base = baseline_time(out)
    for r in out:
        if base and r.step_time_s and r.status == "ok":
            r.vs_baseline = (base - r.step_time_s) / base
    return out


def baseline_time(all_rows: list[Row]) -> float | None:
    times = [r.step_time_s for r in all_rows if r.role == BASELINE and r.status == "ok" and r.step_time_s]
    return times[0] if times else None


def best(all_rows: list[Row]) -> Row | None:
    ok = [r for r in all_rows if r.status == "ok" and r.step_time_s]
    return min(ok, key=lambda r: r.step_time_s) if ok else None


def importances(study: optuna.Study) -> dict[str, float] | str:
    """Parameter importances (fANOVA) over completed trials, or why there are none."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 3:
        return f"needs at least 3 completed trials ({len(done)} so far)"
    try:
        return optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError) as exc:
        return " ".join(str(exc).split())[:200]


def fmt_value(value) -> str:
    """1000000000 -> 1e9, 12845056 -> 1.28e7, True -> true."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and abs(value) >= 10000:
        mantissa, exp = f"{value:.3g}".split("e+") if "e+" in f"{value:.3g}" else (f"{value:.3g}", None)
        return f"{mantissa}e{int(exp)}" if exp else mantissa
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def fmt_seconds(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.3f} s"


def fmt_change(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def changed_params(row: Row, base: dict) -> str:
    """Params that differ from the baseline's, compact."""
    diff = [f"{k}={fmt_value(v)}" for k, v in row.params.items() if base.get(k) != v]
    return ", ".join(diff) if diff else "(baseline values)"


def _evidence_cells(row: Row) -> list[str]:
    cells = []
    for key, _, scale, form in EVIDENCE_COLUMNS:
        value = row.evidence.get(key)
        cells.append("n/a" if value is None else form.format(value * scale))
    return cells


def trial_report(study: optuna.Study, number: int, out: Path | None) -> str | None:
    """The path of a trial's own report (its recording's report.html), relative to `out`, if written."""
    directory = study.trials[number].user_attrs.get("dir") if number < len(study.trials) else None
    if not directory or out is None:
        return None
    page = Path(directory) / "recording" / "report.html"
    return os.path.relpath(page, out) if page.is_file() else None


def markdown(study: optuna.Study, title: str = "otel-gpu tune report", out: Path | None = None) -> str:
    all_rows = rows(study)
    base_row = next((r for r in all_rows if r.role == BASELINE), None)
    base_params = base_row.params if base_row else {}
    top = best(all_rows)
    attrs = study.user_attrs
    lines = [f"# {title}", "", f"- study: `{study.study_name}`",
             f"- base config: `{attrs.get('base_config', '?')}` (sha256 `{str(attrs.get('base_config_sha256', ''))[:12]}`)",
             f"- command: `{attrs.get('command', '?')}`"]
    base_t = baseline_time(all_rows)
    lines.append(f"- baseline step time: {fmt_seconds(base_t)}" if base_t else "- baseline: not measured")
    if top:
        lines.append(f"- best: trial {top.number}, {fmt_seconds(top.step_time_s)} "
                     f"({fmt_change(top.vs_baseline)} against the baseline): {changed_params(top, base_params)}")
    counts: dict[str, int] = {}
    for r in all_rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines += [f"- trials: {len(all_rows)} (" + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")", ""]
    names = list(base_params) or sorted({k for r in all_rows for k in r.params})
    header = ["trial", "role", "status", "step time", "vs baseline", "wall s"] + names + \
             [h for _, h, _, _ in EVIDENCE_COLUMNS] + ["reason"]
    lines += ["## Trials", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in all_rows:
        link = trial_report(study, r.number, out)
        cells = [f"[{r.number}]({link})" if link else str(r.number), r.role, f"**{r.status}**" if r is top else r.status, fmt_seconds(r.step_time_s),
                 fmt_change(r.vs_baseline), f"{r.seconds:.1f}" if r.seconds else "-"]
        cells += [fmt_value(r.params[n]) if n in r.params else "-" for n in names]
        cells += _evidence_cells(r) + [r.reason.replace("|", "\\|") if r.status != "ok" else ""]
        lines.append("| " + " | ".join(cells) + " |")
    imp = importances(study)
    lines += ["", "## Parameter importances", ""]
    if isinstance(imp, str):
        lines.append(f"Not computed: {imp}.")
    else:
        lines += ["| parameter | importance |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in imp.items()]
    lines += ["", "Step time: steady-state mean per optimizer step of the slowest rank, warm-up steps excluded. "
              "Evidence: node-agent readings over each trial's steady window (n/a: not exported, e.g. no GPU). "
              "A linked trial number opens that trial's own report (scored from its recording).", ""]
    return "\n".join(lines)


def terminal_table(study: optuna.Study):
    from rich.table import Table

    all_rows = rows(study)
    base_row = next((r for r in all_rows if r.role == BASELINE), None)
    base_params = base_row.params if base_row else {}
    top = best(all_rows)
    table = Table(title=f"otel-gpu tune: {study.study_name}")
    for col in ("trial", "role", "status", "step time", "vs baseline", "wall s", "changed vs baseline / reason"):
        table.add_column(col, overflow="fold")
    for r in all_rows:
        detail = changed_params(r, base_params) if r.status == "ok" else r.reason
        style = "bold green" if r is top else ("dim" if r.status not in ("ok", "pruned") else None)
        table.add_row(str(r.number), r.role, r.status, fmt_seconds(r.step_time_s), fmt_change(r.vs_baseline),
                      f"{r.seconds:.1f}" if r.seconds else "-", detail, style=style)
    return table


def write_outputs(study: optuna.Study, out: Path) -> dict[str, Path]:
    """report.md, trials.json and best_config.json (the best trial's config) under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = {"report": out / "report.md", "trials": out / "trials.json"}
    text = markdown(study, out=out)
    output.write(written["report"], text)
    C.write_json(written["trials"], [r.__dict__ for r in rows(study)])
    top = best(rows(study))
    if top is not None:
        src = Path(study.trials[top.number].user_attrs.get("dir", "")) / "ds_config.json"
        if src.is_file():
            written["best_config"] = C.write_json(out / "best_config.json", json.loads(src.read_text()))
    return written
