"""The winner explained against the baseline (pure: report rows in, Markdown lines out).

What changed (settings), what moved (each evidence reading, baseline against winner, with the
change and what the number is), how much of the time saved per step is collective time, and how
sure the result is: the step-time change against the spread of the baseline's repeated runs.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..words import count
from . import evidence as E

FRACTIONS = ("sm_activity", "tensor_activity", "gpu_utilization", "cpu_busy")   # compared in points


def mean_evidence(runs: Sequence[Any]) -> dict[str, Any]:
    """Evidence of several runs (the baseline's) as one: the mean of each measured number, collective
    time per kind averaged over the runs that measured it, the first run's reasons for the rest."""
    out: dict[str, Any] = {}
    for key, *_ in E.COLUMNS:
        vals = [float(r.evidence[key]) for r in runs if isinstance(r.evidence.get(key), (int, float))]
        out[key] = sum(vals) / len(vals) if vals else None
    kinds: dict[str, list[float]] = {}
    for r in runs:
        for k, v in (r.evidence.get(E.COLLECTIVES) or {}).items():
            kinds.setdefault(k, []).append(v)
    out[E.COLLECTIVES] = {k: sum(v) / len(v) for k, v in sorted(kinds.items())} or None
    out[E.BASIS] = next((r.evidence.get(E.BASIS) for r in runs if r.evidence.get(E.BASIS)), None)
    out[E.NOT_CHECKED] = next((r.evidence.get(E.NOT_CHECKED) for r in runs if r.evidence.get(E.NOT_CHECKED)), {})
    return out


def _fmt(key: str, value: float) -> str:
    for k, _, scale, form, _ in E.COLUMNS:
        if k == key:
            return form.format(value * scale)
    return f"{value * 1000:.2f} ms"


def _moved(key: str, base: float, win: float) -> str:
    """The change of one reading, its direction spelled out."""
    if key in FRACTIONS:
        return f"{(win - base) * 100:+.1f} points"
    if base == 0:
        return "same" if win == 0 else f"from 0 to {_fmt(key, win)}"
    return f"{(win / base - 1) * 100:+.1f}%"


def _collective_basis(ev: dict) -> str:
    basis = ev.get(E.BASIS) or ""
    what = {"host": "host-timed: the rank blocked in the call (gloo)",
            "gpu": "GPU-timed: the collective's kernels (NCCL, Flight Recorder)"}
    return "; ".join(what.get(b, b) for b in basis.split("+") if b) or "collective time"


def reading_rows(base: dict, win: dict) -> list[list[str]]:
    """[reading, baseline, winner, change, basis] for every evidence reading."""
    rows = []
    for key, header, _, _, basis in E.COLUMNS:
        b, w = base.get(key), win.get(key)
        if b is not None and w is not None:
            rows.append([header, _fmt(key, b), _fmt(key, w), _moved(key, b, w), basis])
        else:
            why = E.why_not(win, key) or E.why_not(base, key) or "not measured"
            rows.append([header, _fmt(key, b) if b is not None else "n/a", _fmt(key, w) if w is not None else "n/a",
                         "-", why])
    bc, wc = base.get(E.COLLECTIVES) or {}, win.get(E.COLLECTIVES) or {}
    for kind in sorted(set(bc) | set(wc)):
        b, w = bc.get(kind), wc.get(kind)
        rows.append([f"{kind} time per step", f"{b * 1000:.2f} ms" if b is not None else "n/a",
                     f"{w * 1000:.2f} ms" if w is not None else "n/a",
                     _moved("", b, w) if b is not None and w is not None else "-",
                     _collective_basis(win if w is not None else base) + ", mean over ranks"])
    if not bc and not wc:
        why = E.why_not(win, E.COLLECTIVES) or E.why_not(base, E.COLLECTIVES) or "not measured"
        rows.append(["collective time per step", "n/a", "n/a", "-", why])
    return rows


def confidence(delta: float, spread: float | None, runs: int) -> str:
    """How sure: the step-time change against the baseline runs' spread (pure)."""
    if spread is None:
        return (f"How sure: not measured: {count(runs, 'baseline run')} completed, so the run-to-run noise is unknown; "
                "run more trials (the baseline repeats when the budget allows) before trusting a small change.")
    size = abs(delta)
    if spread == 0:
        return f"How sure: the {runs} baseline runs gave the same step time; the change is beyond that."
    times = size / spread
    verdict = (f"the change is {times:.1f}x that spread: beyond the noise" if times >= 2 else
               f"the change is only {times:.1f}x that spread: within or near the noise, confirm it with repeated runs")
    return f"How sure: the {runs} baseline runs differ by {spread * 100:.1f}% (max - min over mean); {verdict}."


def winner_section(base_runs: Sequence[Any], top: Any, base_time: float, spread: float | None,
                   base_params: dict, fmt_value, fmt_seconds, fmt_change) -> list[str]:
    """The Markdown section explaining the best trial against the baseline."""
    lines = ["## The winner against the baseline", ""]
    delta = top.step_time_s / base_time - 1.0
    n = len(base_runs)
    of = f"mean of {count(n, 'run')}" if n > 1 else "one run"
    lines.append(f"Trial {top.number}: {fmt_seconds(top.step_time_s)} per step against the baseline's "
                 f"{fmt_seconds(base_time)} ({of}): **step time {fmt_change(delta)}**.")
    lines += ["", confidence(delta, spread, n), ""]
    diff = [(k, base_params.get(k), v) for k, v in top.params.items() if base_params.get(k) != v]
    if diff:
        lines += ["Settings changed:", "", f"| setting | baseline | trial {top.number} |", "|---|---|---|"]
        lines += [f"| {k} | {fmt_value(b) if b is not None else '-'} | {fmt_value(v)} |" for k, b, v in diff]
        lines.append("")
    else:
        lines += ["Settings: the baseline's own (a repeated baseline run was fastest: the difference is noise).", ""]
    base_ev, win_ev = mean_evidence(base_runs), top.evidence
    saved = base_time - top.step_time_s
    bc, wc = base_ev.get(E.COLLECTIVES), win_ev.get(E.COLLECTIVES)
    if bc and wc and saved > 0:
        cb, cw = sum(bc.values()), sum(wc.values())
        share = (cb - cw) / saved
        lines += [f"Collective time per step: {cb * 1000:.2f} -> {cw * 1000:.2f} ms ({_moved('', cb, cw)}); "
                  f"{(cb - cw) * 1000:+.2f} ms against {-saved * 1000:+.2f} ms of step time, "
                  f"{'i.e. ' + format(share * 100, '.0f') + '% of the time saved' if share > 0 else 'so the time was saved outside collectives'}.",
                  ""]
    window = win_ev.get(E.WINDOW)
    lines += [f"Readings over each run's steady window (warm-up excluded{f'; the winner: {window:.1f} s' if window else ''}; "
              f"the baseline: mean over its runs):", "",
              f"| reading | baseline | trial {top.number} | change | what it is / why not measured |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in reading_rows(base_ev, win_ev)]
    lines.append("")
    return lines

