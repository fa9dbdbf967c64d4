"""The tuning report: every trial, its parameters, status, step time, change against the baseline,
the node-agent evidence over its steady window, the winner explained against the baseline with that
evidence, how sure the result is (noise between the baseline's repeated runs), and parameter
importances (terminal and Markdown).

Direction is always spelled out: a change is in step time ("step time -27.9%": less time per step)
together with the speed ratio ("1.39x faster").

Built from the study storage alone, so any node (or a later `--report-only`) can write it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import TrialState

from .. import output
from ..safe_text import markdown as md, visible
from ..words import count, noun
from . import config as C
from . import evidence as E
from . import explain
from . import scores as SC
from .sampler import BASELINE, REPEAT

EVIDENCE_COLUMNS = tuple((key, header, scale, form) for key, header, scale, form, _ in E.COLUMNS)


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
    vs_baseline: float | None = None       # change in step time against the baseline: -0.2 = 20% less time per step
    overhead_s: float | None = None
    repeat: int = 0                        # a baseline run after the first: 1, 2, ...


def rows(study: optuna.Study) -> list[Row]:
    out = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            continue
        a = t.user_attrs
        status = a.get("status") or ("running" if t.state == TrialState.RUNNING else t.state.name.lower())
        out.append(Row(t.number, a.get("role", "sampled"), status, a.get("reason", ""), a.get("step_time_s"),
                       a.get("seconds"), dict(t.params), a.get("evidence") or {}, overhead_s=a.get("overhead_s"),
                       repeat=int(a.get(REPEAT) or 0)))
    base = baseline_time(out)
    for r in out:
        if base and r.step_time_s and r.status == "ok":
            r.vs_baseline = change(r.step_time_s, base)
    return out


def change(value: float, base: float) -> float:
    """Relative change of a step time against the baseline's: -0.2 = 20% less time per step."""
    return value / base - 1.0


def baseline_runs(all_rows: list[Row]) -> list[Row]:
    return [r for r in all_rows if r.role == BASELINE and r.status == "ok" and r.step_time_s]


def baseline_time(all_rows: list[Row]) -> float | None:
    """The baseline's step time: the mean of its completed runs."""
    times = [r.step_time_s for r in baseline_runs(all_rows)]
    return sum(times) / len(times) if times else None


def noise(all_rows: list[Row]) -> tuple[float | None, str]:
    """(spread, sentence): the baseline runs' spread, (max - min) / mean of their step times, or
    None with why it is not measured."""
    times = [r.step_time_s for r in baseline_runs(all_rows)]
    if len(times) < 2:
        return None, (f"noise not measured: only {count(len(times), 'baseline run')} completed (a repeat runs when "
                      "--trials leaves room for it; see --baseline-runs)")
    mean = sum(times) / len(times)
    spread = (max(times) - min(times)) / mean
    return spread, (f"noise: the {len(times)} baseline runs differ by {spread * 100:.1f}% "
                    f"({', '.join(fmt_seconds(t) for t in times)})")


def best(all_rows: list[Row], study: optuna.Study | None = None) -> Row | None:
    """The best trial: the fastest one under step time, else the study's best by its objective; None for
    a multi-objective study (its Pareto front is listed instead: `front_lines`)."""
    if study is not None and SC.of_study(study) != SC.DEFAULT:
        top = SC.front(study)
        number = top[0].number if len(top) == 1 and len(study.directions) == 1 else None
        return next((r for r in all_rows if r.number == number and r.status == "ok"), None)
    ok = [r for r in all_rows if r.status == "ok" and r.step_time_s]
    return min(ok, key=lambda r: r.step_time_s) if ok else None


def front_lines(study: optuna.Study) -> list[str]:
    """What the trials were scored by and, for several objectives, the Pareto front (none of its trials is
    worse than another in every objective)."""
    objectives = SC.of_study(study)
    if objectives == SC.DEFAULT:
        return []
    said = ", ".join(f"{o} ({SC.OBJECTIVES[o][0]})" for o in objectives)
    top = SC.front(study)
    if len(objectives) == 1:
        return [f"- scored by: {said}"]
    out = [f"- scored by: {said}; the Pareto front ({count(len(top), 'trial')}):"]
    for t in top:
        shown = ", ".join(SC.shown(o, v) for o, v in zip(objectives, t.values))
        out.append(f"  - trial {t.number}: {shown} ({md(str(Path(t.user_attrs.get('dir', '')) / 'ds_config.json'))})")
    return out if top else out[:1] + ["  - no trial completed"]


def importances(study: optuna.Study) -> dict[str, float] | str:
    """Parameter importances (fANOVA) over completed trials, or why there are none."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 3:
        return f"needs at least 3 completed trials ({count(len(done), 'trial')} so far)"
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
    """A step-time change with its direction in words: '-27.9% (1.39x faster)'."""
    if value is None or not math.isfinite(value) or value <= -1.0:
        return "-"
    ratio = 1.0 / (1.0 + value)
    if abs(value) < 0.0005:
        return "+0.0% (same speed)"
    words = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    return f"{value * 100:+.1f}% ({words})"


def changed_params(row: Row, base: dict) -> str:
    """Params that differ from the baseline's, compact."""
    diff = [f"{k}={fmt_value(v)}" for k, v in row.params.items() if base.get(k) != v]
    return ", ".join(diff) if diff else "(baseline values)"


def _evidence_cells(row: Row) -> list[str]:
    cells = []
    for key, _, scale, form in EVIDENCE_COLUMNS:
        value = row.evidence.get(key)
        cells.append("n/a" if value is None else form.format(value * scale))
    return cells + [fmt_collectives(row.evidence)]


def fmt_collectives(evidence: dict) -> str:
    """'all_gather 12.31, reduce_scatter 4.02' (ms per step), or n/a."""
    kinds = evidence.get(E.COLLECTIVES) or {}
    return ", ".join(f"{k} {v * 1000:.2f}" for k, v in kinds.items()) if kinds else "n/a"


def not_checked_lines(all_rows: list[Row]) -> list[str]:
    """One line per evidence column and reason: which trials show n/a, and why."""
    headers = {key: header for key, header, *_ in E.COLUMNS} | {E.COLLECTIVES: "collective ms/step"}
    by: dict[tuple[str, str], list[int]] = {}
    for r in all_rows:
        if not r.evidence:
            continue
        for key, why in (r.evidence.get(E.NOT_CHECKED) or {}).items():
            by.setdefault((key, why), []).append(r.number)
        if r.evidence.get("node_agent"):
            by.setdefault(("node agent", r.evidence["node_agent"]), []).append(r.number)
    return [f"- {headers.get(key, key)}: n/a in {noun(len(ns), 'trial')} {_numbers(ns)}: {why}"
            for (key, why), ns in by.items()]


def _numbers(ns: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for i, n in enumerate(ns):
        if start is None:
            start = n
        if i + 1 == len(ns) or ns[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


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
    top = best(all_rows, study)
    attrs = study.user_attrs
    lines = [f"# {title}", "", f"- study: {md(study.study_name)}",
             f"- base config: {md(str(attrs.get('base_config', '?')))} "
             f"(sha256 {md(str(attrs.get('base_config_sha256', ''))[:12])})",
             f"- command: {md(str(attrs.get('command', '?')))}"]
    base_t = baseline_time(all_rows)
    runs = baseline_runs(all_rows)
    spread, said = noise(all_rows)
    lines.append(f"- baseline step time: {fmt_seconds(base_t)}" + (f" (mean of {len(runs)} runs)" if len(runs) > 1 else "")
                 if base_t else "- baseline: not measured")
    if top:
        lines.append(f"- best: trial {top.number}, {fmt_seconds(top.step_time_s)}: step time "
                     f"{fmt_change(top.vs_baseline)} against the baseline; {changed_params(top, base_params)}")
    lines.append(f"- {said}")
    lines += front_lines(study)
    counts: dict[str, int] = {}
    for r in all_rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines += [f"- trials: {len(all_rows)} (" + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")", ""]
    names = list(base_params) or sorted({k for r in all_rows for k in r.params})
    header = ["trial", "role", "status", "step time", "step time vs baseline", "wall s"] + names + \
             [h for _, h, _, _ in EVIDENCE_COLUMNS] + ["collective ms/step", "reason"]
    if top and base_t:
        lines += explain.winner_section(runs, top, base_t, spread, base_params, fmt_value, fmt_seconds, fmt_change)
    lines += ["## Trials", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in all_rows:
        link = trial_report(study, r.number, out)
        role = f"{r.role} (repeat {r.repeat})" if r.repeat else r.role
        cells = [f"[{r.number}]({link})" if link else str(r.number), role, f"**{r.status}**" if r is top else r.status, fmt_seconds(r.step_time_s),
                 fmt_change(r.vs_baseline), f"{r.seconds:.1f}" if r.seconds else "-"]
        cells += [fmt_value(r.params[n]) if n in r.params else "-" for n in names]
        cells += _evidence_cells(r) + [md(r.reason) if r.status != "ok" else ""]   # a trial's own output
        lines.append("| " + " | ".join(cells) + " |")
    missing = not_checked_lines(all_rows)
    if missing:
        lines += ["", "Evidence shown as n/a, and why:", ""] + missing
    imp = importances(study)
    lines += ["", "## Parameter importances", ""]
    if isinstance(imp, str):
        lines.append(f"Not computed: {imp}.")
    else:
        lines += ["| parameter | importance |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in imp.items()]
    lines += ["", "Step time: steady-state mean per optimizer step of the slowest rank, warm-up steps excluded; "
              "'step time -20.0% (1.25x faster)' is 20% less time per step than the baseline (the mean of its runs). "
              "Evidence: node-agent readings over each trial's steady window, and the ranks' collective time per "
              "optimizer step by kind (mean over ranks). A linked trial number opens that trial's own report "
              "(scored from its recording).", ""]
    return "\n".join(lines)


def terminal_table(study: optuna.Study):
    """The trials as a rich table; every cell plain text shown `visible` (a reason is a trial's own output)."""
    from rich.table import Table
    from rich.text import Text

    all_rows = rows(study)
    base_row = next((r for r in all_rows if r.role == BASELINE), None)
    base_params = base_row.params if base_row else {}
    top = best(all_rows, study)
    table = Table(title=Text(visible(f"otel-gpu tune: {study.study_name}")))
    for col in ("trial", "role", "status", "step time", "step time vs baseline", "wall s", "changed vs baseline / reason"):
        table.add_column(col, overflow="fold")
    for r in all_rows:
        detail = changed_params(r, base_params) if r.status == "ok" else r.reason
        style = "bold green" if r is top else ("dim" if r.status not in ("ok", "pruned") else None)
        table.add_row(*(Text(visible(x)) for x in (str(r.number), r.role, r.status, fmt_seconds(r.step_time_s),
                                                    fmt_change(r.vs_baseline), f"{r.seconds:.1f}" if r.seconds else "-",
                                                    detail)), style=style)
    return table


def write_outputs(study: optuna.Study, out: Path) -> dict[str, Path]:
    """report.md, trials.json and best_config.json (the best trial's config) under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = {"report": out / "report.md", "trials": out / "trials.json"}
    text = markdown(study, out=out)
    output.write(written["report"], text)
    C.write_json(written["trials"], [r.__dict__ for r in rows(study)])
    top = best(rows(study), study)
    if top is not None:
        src = Path(study.trials[top.number].user_attrs.get("dir", "")) / "ds_config.json"
        if src.is_file():
            written["best_config"] = C.write_json(out / "best_config.json", C.read_config(src))
    return written
