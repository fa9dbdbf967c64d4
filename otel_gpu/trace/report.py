"""Output of trace results as rich tables for the terminal (the JSON and CSV files: report_files)."""
from __future__ import annotations

import re

import numpy as np

from .. import words
from ..safe_text import markup as escape
from .grouping import rank_ranges
from .report_files import CSV_TABLES, csv_files, diff_csv, write_outputs  # noqa: F401 (imported from here)


def _fmt(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:,.2f}".rstrip("0").rstrip(".")
    return str(x)


# columns folded as names; columns left out first on a narrow terminal (highest number first)
_TEXT_COLUMNS = {"name", "pattern", "kernel sequence", "most time on the path", "launched by"}
_LABEL_COLUMNS = {"rank", "step", "kernel_type", "category", "stream"}
_DROP_FIRST = {"kernel_type": 3, "max us": 2, "mean us": 1, "non-compute": 2, "non-compute %": 2, "span": 1,
               "short": 2, "runtime outliers": 1, "delay outliers": 1, "changes": 2, "points": 2, "median": 1,
               "ranks": 3, "busy us": 2, "median busy us": 1, "longest step us": 2, "mean cpu us": 1,
               "cpu %": 1, "gpu comm %": 1, "kernel gaps %": 2, "launch delay %": 2, "most time on the path": 3,
               "op start to launch us": 1, "launch to kernel us": 2, "# kernels": 2, "CPU op us": 1,
               "count A": 3, "count B": 3, "mean A us": 2, "mean B us": 2, "total A us": 1, "total B us": 1,
               "kind": 2, "ratio": 1, "overlap us": 1}


def _table(title: str, cols: list[str], rows: list[list]):
    """A table that fits the console it is printed on (otel_gpu.terminal): names fold, numbers never
    wrap, and the columns of least use are left out on a narrow terminal (the CSV files have them all)."""
    from ..terminal import Col, FitTable

    spec = [Col(c, 0 if i == 0 else _DROP_FIRST.get(c, 0), text=c in _TEXT_COLUMNS, left=c in _LABEL_COLUMNS)
            for i, c in enumerate(cols)]
    return FitTable(title, spec, [[_fmt(x) if not isinstance(x, str) else x for x in r] for r in rows],
                    note="--csv has them")


def _short(name: str, n: int = 70) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


SCREEN_RANKS = 16  # above this many ranks, per-rank tables show the notable ranks only


def _notable(rows: list[dict], key: str) -> tuple[list[dict], str]:
    """Rows of all ranks, or with more than SCREEN_RANKS ranks those of the 3 lowest, the median and
    the 4 highest ranks by ``key`` (a rank's highest value over its rows), and a title suffix."""
    ranks = sorted({r["rank"] for r in rows})
    if len(ranks) <= SCREEN_RANKS:
        return rows, ""
    per: dict[int, float] = {}
    for r in rows:
        x = r[key]
        x = float("-inf") if x is None or x != x else float(x)
        per[r["rank"]] = max(per.get(r["rank"], float("-inf")), x)
    order = sorted(ranks, key=lambda k: (per[k], k))
    pick = set(order[:3]) | {order[len(order) // 2]} | set(order[-4:])
    return ([r for r in rows if r["rank"] in pick],
            f"; {len(pick)} of {len(ranks)} ranks: lowest, median and highest {key} (all in --csv)")


def _merge_rank_notes(notes: list[str]) -> list[str]:
    """"rank 3: no GPU events" for many ranks -> one "ranks 0-63: no GPU events"."""
    out: list[str] = []
    by_text: dict[str, list[int]] = {}
    for n in notes:
        m = re.match(r"rank (\d+): (.*)$", n)
        if m:
            if m.group(2) not in by_text:
                out.append(m.group(2))  # placeholder, replaced below in first-seen order
            by_text.setdefault(m.group(2), []).append(int(m.group(1)))
        else:
            out.append(n)
    return [(("rank " if len(by_text[n]) == 1 else "ranks ") + rank_ranges(by_text[n]) + ": " + n)
            if n in by_text else n for n in out]


def _pattern_text(pattern: str, shown: int = 4) -> str:
    """"op|k1|k2|...|k600" -> "op: k1 > k2 > k3 > k4 > ... (+596)", each name shortened."""
    op, *kernels = pattern.split("|")
    parts = [_short(k, 40) for k in kernels[:shown]]
    more = f" > ... (+{len(kernels) - shown})" if len(kernels) > shown else ""
    return f"{_short(op, 40)}: " + " > ".join(parts) + more


def render_kernel_sequences(doc: dict, console, top_k: int = 5) -> None:
    """Top ``top_k`` patterns per requested operator, pooled over ranks."""
    from ..terminal import hang

    req = doc.get("kernel_sequences_request")
    if not req:
        return
    pooled = doc["kernel_sequences_all_ranks"]
    for op in req["operators"]:
        rows = [r for r in pooled if r["operator"] == op]
        if not rows:
            hang(console, "", f"Frequent kernel sequences under {op!r}: none with {req['min_pattern_len']} or more "
                              "kernels (see the notes)")
            continue
        shown = rows[:top_k]
        console.print(_table(f"Frequent kernel sequences under {op!r} (top {len(shown)} of "
                             f"{words.count(len(rows), 'pattern')}, ops launching >= "
                             f"{words.count(req['min_pattern_len'], 'kernel')}; counts and us summed over ranks)",
                             ["pattern", "# kernels", "count", "ranks", "GPU kernel us", "CPU op us"],
                             [[_pattern_text(r["pattern"]), r["kernels"], r["count"], rank_ranges(r["ranks"]),
                               float(r["gpu_kernel_duration_us"]), float(r["cpu_op_duration_us"])] for r in shown]))


# notes that matter only to compare figures with HTA's: shown with --verbose (always in the JSON)
_PARITY_NOTES = ("shorter than 1 us end before they start",)


def _parity_note(note: str) -> bool:
    return any(p in note for p in _PARITY_NOTES)


def render_analysis(doc: dict, console, top: int = 10, sequences_top: int = 5, verbose: bool = False) -> None:
    """Print the analysis as terminal tables at the console's width; ``verbose``: also the notes that
    matter only for parity with HTA."""
    from ..terminal import hang

    hang(console, "[bold]Trace set[/bold] ", f"{escape(doc['trace_dir'])}  {words.count(len(doc['ranks']), 'rank')} "
                                             f"({rank_ranges(doc['ranks'])})", markup=True)
    for n in _merge_rank_notes([n for n in doc["notes"] if verbose or not _parity_note(n)]):
        hang(console, "  note: ", n)
    if doc["temporal_breakdown"]:
        rows, more = _notable(doc["temporal_breakdown"], "idle_time_pctg")
        console.print(_table("Temporal breakdown (us, % of first-kernel-to-last-kernel span)" + more,
                             ["rank", "idle", "compute", "non-compute", "span", "idle %", "compute %", "non-compute %"],
                             [[t["rank"], t["idle_time_us"], t["compute_time_us"], t["non_compute_time_us"],
                               t["kernel_time_us"], t["idle_time_pctg"], t["compute_time_pctg"],
                               t["non_compute_time_pctg"]] for t in rows]))
    if doc["kernel_type_breakdown"]:
        console.print(_table("GPU time by kernel type (all ranks)", ["kernel_type", "time us", "%"],
                             [[r["kernel_type"], r["sum"], r["percentage"]] for r in doc["kernel_type_breakdown"]]))
        top_k = sorted(doc["kernel_breakdown"], key=lambda r: -r["sum"])[:top]
        console.print(_table(f"Top {words.count(len(top_k), 'kernel')}", ["name", "kernel_type", "rank", "total us", "kernels",
                                                            "mean us per kernel", "max us per kernel"],
                             [[_short(r["name"]), r["kernel_type"], r["rank"], r["sum"], r["kernels"], r["kernel_mean"],
                               r["kernel_max"]] for r in top_k]))
    if doc["idle_time_breakdown"]:
        rows, more = _notable(doc["idle_time_breakdown"], "idle_time")
        console.print(_table("GPU idle time by stream" + more, ["rank", "stream", "category", "idle us", "ratio"],
                             [[r["rank"], r["stream"], r["idle_category"], r["idle_time"], r["idle_time_ratio"]]
                              for r in rows]))
    if doc["temporal_breakdown"]:
        rows, more = _notable(doc["comm_comp_overlap"], "comp_comm_overlap_pctg")
        console.print(_table("Communication / computation overlap" + more, ["rank", "comm us", "overlap us", "overlap %"],
                             [[r["rank"], r["comm_time_us"], r["overlap_time_us"], r["comp_comm_overlap_pctg"]]
                              for r in rows]))
        rows, more = _notable(doc["launch_stats"], "mean_launch_delay_us")
        console.print(_table("Kernel launches" + more, ["rank", "launches", "short", "runtime outliers",
                                                        "delay outliers", "mean cpu us", "mean delay us"],
                             [[r["rank"], r["launches"], r["short_kernels"], r["runtime_outliers"],
                               r["launch_delay_outliers"], r["mean_cpu_duration_us"], r["mean_launch_delay_us"]]
                              for r in rows]))
    if doc.get("queue_length_summary"):
        rows, more = _notable(doc["queue_length_summary"], "max")
        console.print(_table("Launch queue length per stream (outstanding GPU operations)" + more,
                             ["rank", "stream", "changes", "mean", "median", "max"],
                             [[r["rank"], r["stream"], int(r["count"]), r["mean"], r["50%"], r["max"]] for r in rows]))
    for r in doc.get("queue_full_blocked") or []:
        hang(console, f"Rank {r['rank']} stream {r['stream']}: ", f"launch queue full for "
                                                                f"{r['duration_at_max_queue_length']:,.0f} us "
                                                                f"({100 * r['relative_duration_at_max_queue_length']:.2f}% "
                                                                "of the trace)")
    if doc.get("memory_bw_summary"):
        rows, more = _notable(doc["memory_bw_summary"], "mean")
        console.print(_table("Memory copy bandwidth (GB/s, while copies run)" + more,
                             ["rank", "name", "points", "mean", "median", "max"],
                             [[r["rank"], r["name"], int(r["count"]), r["mean"], r["50%"], r["max"]] for r in rows]))
    cross = doc["cross_rank"]
    if cross["steps"]:
        console.print(_table("Steps across ranks (busy = step - communication, us)",
                             ["step", "ranks", "straggler", "busy us", "median busy us", "excess us",
                              "imbalance %", "longest step us"],
                             [[s["step"], s["ranks"], s["straggler_rank"], s["straggler_busy_us"], s["median_busy_us"],
                               s["excess_us"], s["imbalance_pct"], s["slowest_step_us"]] for s in cross["steps"]]))
    if doc.get("gpu_user_annotation_breakdown"):
        rows = sorted(doc["gpu_user_annotation_breakdown"], key=lambda r: -r["sum"])[:top]
        console.print(_table(f"GPU time per user annotation (top {len(rows)})",
                             ["name", "rank", "total us", "mean us", "max us"],
                             [[_short(r["name"]), r["rank"], r["sum"], r["mean"], r["max"]] for r in rows]))
    if doc.get("kernels_per_annotation"):
        rows = sorted((r for r in doc["kernels_per_annotation"] if r["annotation"]),
                      key=lambda r: -r["kernel_time_us"])[:top]
        console.print(_table(f"Kernels inside GPU user annotations (innermost; top {len(rows)} by kernel time)",
                             ["name", "rank", "kernels", "kernel time us"],
                             [[_short(r["annotation"]), r["rank"], r["kernels"], r["kernel_time_us"]] for r in rows]))
    if doc.get("aten_op_kernels_all_ranks"):
        rows = doc["aten_op_kernels_all_ranks"][:top]
        console.print(_table(f"ATen ops and the kernels they launch (all ranks, {len(rows)} most frequent)",
                             ["name", "kernel sequence", "count", "op start to launch us", "launch to kernel us"],
                             [[_short(r["aten_op_name"], 40), _short(r["kernel_sequence"], 80), r["occurrence_count"],
                               r["avg_aten_op_launch_delay"], r["avg_runtime_delay"]] for r in rows]))
    render_kernel_sequences(doc, console, sequences_top)
    _render_critical_path(doc.get("critical_path") or [], console)
    ps = doc.get("potential_stragglers") or {}
    if ps.get("ranks"):
        hang(console, "Potential stragglers ", f"(HTA's method: latest start of {_short(ps['kernel'], 60)} on stream "
                                               f"{ps['stream']}): {words.noun(len(ps['ranks']), 'rank')} "
                                               f"{rank_ranges(ps['ranks'])}")
    if "straggler" in cross:
        s = cross["straggler"]
        hang(console, "Straggler: ", f"rank {s['rank']}, busiest in {s['steps_slowest']} of "
                                     f"{words.count(len(cross['steps']), 'step')}, {s['excess_us']:,.0f} us "
                                     f"({s['excess_pct']:+.1f}%) more busy time than the median rank")
    if doc.get("gpu_time_by_code", {}).get("top_stacks"):
        from .gpu_flame_cli import table as gpu_time_table
        console.print(_table(*gpu_time_table(doc["gpu_time_by_code"], top)))
    render_findings(doc, console)


def _render_critical_path(paths: list[dict], console) -> None:
    """Per rank: the critical path's length and where its time goes (% of the path)."""
    from ..terminal import hang

    ok = [p for p in paths if "error" not in p]
    if ok:
        rows, more = _notable(ok, "length_us")
        windows = sorted({p["window"].split(" (")[0] for p in rows})
        console.print(_table(f"Critical path ({'; '.join(windows)}; % of the path)" + more,
                             ["rank", "path us", "cpu %", "gpu compute %", "gpu comm %", "kernel gaps %",
                              "launch delay %", "most time on the path"],
                             [[p["rank"], p["length_us"], p["cpu_bound_pct"], p["gpu_compute_bound_pct"],
                               p["gpu_communication_bound_pct"], p["gpu_kernel_kernel_overhead_pct"],
                               p["gpu_kernel_launch_overhead_pct"],
                               _short(p["top_events"][0]["name"], 40) + f" ({p['top_events'][0]['pct']:.0f}%)"
                               if p["top_events"] else ""] for p in rows]))
        for n in _merge_rank_notes([f"rank {p['rank']}: {n}" for p in ok for n in p["notes"]]):
            hang(console, "  critical path note: ", n)
    for n in _merge_rank_notes([f"rank {p['rank']}: {p['error']}" for p in paths if "error" in p]):
        hang(console, "Critical path not computed: ", n)


def render_findings(doc: dict, console) -> None:
    """Findings grouped across ranks; an effect is printed under its cause, not apart (what
    ``--quiet`` prints)."""
    from ..terminal import hang

    findings = doc["findings"]
    th = doc.get("thresholds", {})
    small: dict[str, list[dict]] = {}  # patterns over their threshold on some rank, never with enough at stake
    for c in doc.get("checks", []):
        if c["triggered"] and not c["reported"]:
            small.setdefault(c["pattern"], []).append(c)
    small = {p: cs for p, cs in small.items() if p not in {f["pattern"] for f in findings}}
    if small:
        parts = [f"{p} ({words.noun(len({c['rank'] for c in cs}), 'rank')} {rank_ranges([c['rank'] for c in cs])}, "
                 f"at most "
                 f"{max(c['share_of_span_pct'] for c in cs):.2g}% of the span)" for p, cs in sorted(small.items())]
        hang(console, "", f"Over their threshold with less than {th.get('min_time_share_pct', 0):g}% of the span at "
                          f"stake, not reported (checks.csv; --min-impact 0 shows them): {', '.join(parts)}")
    if not findings:
        hang(console, "", f"No anti-pattern found (no check over its threshold with at least "
                          f"{th.get('min_time_share_pct', 0):g}% of the span at stake).")
        return
    console.print(f"[bold]Findings[/bold] (at stake >= {th.get('min_time_share_pct', 0):g}% of the span; biggest "
                  "first, with the idle each causes)")
    by_pattern = {f["pattern"]: f for f in findings}
    # an effect is printed once, under its biggest cause
    primary = {f["pattern"]: f["caused_by"][0]["pattern"] for f in findings if f["caused_by"]}
    i = 0
    for f in findings:
        if f["pattern"] in primary:
            continue
        i += 1
        _print_finding(console, f, f"{i}.", "")
        for link in f["leads_to"]:
            how = ("ends where these kernels start (the GPU waited for their launch)"
                   if f["pattern"] == "many_short_kernels" else
                   "begins inside these calls (the GPU drained while the CPU waited)")
            where = ("rank " if link["ranks_text"].isdigit() else "ranks ") + link["ranks_text"]
            hang(console, "   ", f"leads to: {link['idle_us']:,.0f} us of GPU idle ({link['share_of_idle_pct']:g}% of "
                                  f"the idle on {where}) {how}")
            if primary.get(link["pattern"]) == f["pattern"]:
                _print_finding(console, by_pattern[link["pattern"]], "   ->", "      ")


def _print_finding(console, f: dict, bullet: str, pad: str) -> None:
    from ..terminal import hang

    ind, at, share = f["indicator"], f["time_at_stake_per_rank_us"], f["share_of_span_pct"]
    n, total = len(f["ranks"]), f["ranks_analysed"]
    who = f"rank {f['ranks_text']}" if n == 1 else f"ranks {f['ranks_text']} ({n} of {total})"
    lead = pad + "   "
    if n == 1 or ind["min"] == ind["max"]:
        value = f"{ind['median']:g}" + ("" if n == 1 else " on each")
    else:
        value = f"median {ind['median']:g} (min {ind['min']:g}, max {ind['max']:g})"
    if n == 1 or at["min"] == at["max"]:
        stake = f"{at['median']:,.0f} us" + ("" if n == 1 else " per rank")
    else:
        stake = f"median {at['median']:,.0f} us per rank (max {at['max']:,.0f})"
    hang(console, f"{bullet} ", f"[bold]{escape(f['title'])}[/bold], {escape(who)}: {escape(ind['name'])} {value}, "
                                f"threshold {ind['threshold']:g}; time at stake {stake}, {share['median']:.1f}% of the "
                                f"{escape(f['span'])}", markup=True)
    if _where(f["where"]):
        hang(console, lead, f"where (rank {f['worst_rank']}): {_where(f['where'])}")
    if f["caused_by"]:
        causes = ", ".join(f"{c['pattern']} ({c['share_of_idle_pct']:g}%)" for c in f["caused_by"])
        hang(console, lead, f"caused by: {causes}")
    if f["ranks_triggered_below_min_share"]:
        hang(console, lead, "also over the threshold, with less at stake: ranks "
                            f"{rank_ranges(f['ranks_triggered_below_min_share'])}")
    hang(console, lead, f"fix: {f['fix']}")


def _where(w: dict) -> str:
    parts = []
    for key in ("ops", "kernels", "calls", "copies"):
        if w.get(key):
            known = [(n, c) for n, c in w[key] if n != "?"][:3]
            if known:
                parts.append(f"{key}: " + ", ".join(f"{_short(n, 50)} x{c}" for n, c in known))
    for key in ("streams", "steps"):
        if w.get(key):
            parts.append(f"{key}: {w[key][:8]}")
    if w.get("largest_gaps"):
        g = w["largest_gaps"][0]
        parts.append(f"largest gap {g['length_us']:,.0f} us at {g['start_us']:,.0f} us (step {g['step']})")
    from .where_text import where_details  # the expert findings' evidence (idle causes, shapes, queue)
    return "; ".join(parts + where_details(w))


def render_diff(doc: dict, console, top: int = 20) -> None:
    from ..terminal import hang

    hang(console, "[bold]A[/bold] ", f"{escape(doc['a'])} ({words.count(doc['ranks_a'], 'rank')})  ->  [bold]B[/bold] "
                                     f"{escape(doc['b'])} ({words.count(doc['ranks_b'], 'rank')}); per-rank figures",
         markup=True)
    for n in doc.get("notes", []):
        hang(console, "  note: ", n)
    sa, sb = doc["summary_a"], doc["summary_b"]
    if sa and sb:
        console.print(f"GPU span {sa['kernel_time_us']:,.0f} -> {sb['kernel_time_us']:,.0f} us, idle "
                      f"{sa['idle_time_pctg']:.2f}% -> {sb['idle_time_pctg']:.2f}%")
    console.print(_table(f"Biggest changes (top {min(top, len(doc['rows']))})",
                         ["name", "kind", "count A", "count B", "total A us", "total B us", "delta us",
                          "mean A us", "mean B us", "delta %"],
                         [[_short(r["name"]), r["kind"], r["count_a"], r["count_b"], r["total_a_us"],
                           r["total_b_us"], r["delta_total_us"], r["mean_a_us"], r["mean_b_us"], r["delta_pct"]]
                          for r in doc["rows"][:top]]))
