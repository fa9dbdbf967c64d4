"""Reference results of HolisticTraceAnalysis 0.5.0 for the analyses beyond the first five.

Run with HTA installed in its own virtual environment (it is never a dependency of otel-gpu):

    python -m venv /tmp/hta && /tmp/hta/bin/pip install HolisticTraceAnalysis==0.5.0
    /tmp/hta/bin/python tests/data/hta_extra/make_reference.py ../shared/data/traces tests/data/hta_extra

For every trace set (a folder of per-rank files) under the first argument it writes, under the
same relative path in the second: queue_length_summary.csv, queue_full_blocked.csv,
memory_bw_summary.csv, potential_stragglers.json, aten_op_kernels_rank<r>.csv,
gpu_user_annotation_breakdown.csv, kernels_per_annotation.csv (HTA's per-kernel table of
get_gpu_kernels_with_user_annotations, counted and summed per annotation), queue_length_series_rank<r>.csv and memory_bw_series_rank<r>.csv
(only when under 300 kB: the larger series are checked through their summaries), and
run_info.json with each call, its wall
time and its error (HTA raises on some sets; the error is the reference then).
"""
import json
import os
import platform
import resource
import sys
import time
import traceback


def _flat(df):
    """A describe() table with (column, statistic) headers -> flat CSV-ready frame."""
    df = df.copy()
    df.columns = [c[1] if isinstance(c, tuple) else c for c in df.columns]
    return df.reset_index()


def step_recorder(steps: list):
    """step(name, call, fn): run fn, append its call, wall time, peak memory and error (HTA's own
    failure is part of the reference) to ``steps``; returns the error or None."""
    def step(name, call, fn):
        t0 = time.perf_counter()
        err = None
        try:
            fn()
        except Exception as exc:
            err = f"{exc.__class__.__name__}: {exc}".splitlines()[0][:300]
            traceback.print_exc()
        steps.append({"step": name, "call": call, "wall_s": round(time.perf_counter() - t0, 4), "error": err,
                      "self_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
        return err
    return step


def load_analysis(trace_dir: str, step):
    """HTA's TraceAnalysis of a folder (None if it fails) and its ranks; no figure is shown."""
    import plotly.graph_objects as go

    go.Figure.show = lambda self, *a, **k: None  # some analyses show a figure unasked
    from hta.trace_analysis import TraceAnalysis

    holder = {}
    if step("load", f"TraceAnalysis(trace_dir={trace_dir!r})",
            lambda: holder.setdefault("a", TraceAnalysis(trace_dir=trace_dir))):
        return None, []
    return holder["a"], sorted(holder["a"].t.traces)


def write_run_info(out: str, name: str, trace_dir: str, ranks: list, steps: list) -> None:
    import numpy
    import pandas as pd

    info = {"trace_dir": trace_dir, "ranks": ranks, "hta_version": "0.5.0", "pandas": pd.__version__,
            "numpy": numpy.__version__, "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "steps": steps}
    with open(os.path.join(out, name), "w") as fh:
        json.dump(info, fh, indent=1)


def run_set(trace_dir: str, out: str) -> None:
    import pandas as pd

    os.makedirs(out, exist_ok=True)
    steps: list = []
    step = step_recorder(steps)
    a, ranks = load_analysis(trace_dir, step)

    def queue():
        s = a.get_queue_length_summary(ranks=ranks)
        if s is not None:
            _flat(s).to_csv(os.path.join(out, "queue_length_summary.csv"), index=False)
        series = a.get_queue_length_time_series(ranks=ranks)
        b = a.get_time_spent_blocked_on_full_queue(series)
        if b is not None:
            b.to_csv(os.path.join(out, "queue_full_blocked.csv"), index=False)

    def membw():
        s = a.get_memory_bw_summary(ranks=ranks)
        if s is not None:
            _flat(s).to_csv(os.path.join(out, "memory_bw_summary.csv"), index=False)

    def stragglers():
        got = a.get_potential_stragglers()
        json.dump({"potential_stragglers": [int(r) for r in got]},
                  open(os.path.join(out, "potential_stragglers.json"), "w"))

    def aten():
        for r, df in a.get_aten_op_kernels_and_delay(ranks=ranks).items():
            df.to_csv(os.path.join(out, f"aten_op_kernels_rank{r}.csv"), index=False)

    def series():
        for label, got in (("queue_length_series", a.get_queue_length_time_series(ranks=ranks)),
                           ("memory_bw_series", a.get_memory_bw_time_series(ranks=ranks))):
            for r, df in got.items():
                path = os.path.join(out, f"{label}_rank{r}.csv")
                df.to_csv(path, index=False)
                if os.path.getsize(path) > 300_000:
                    os.unlink(path)

    def kernels_per_annotation():
        tables = []
        for r in ranks:
            df = a.get_gpu_kernels_with_user_annotations(rank=r, expand_names=True, shortern_names=False)
            if df is not None:
                g = df.groupby("s_user_annotation")["dur"].agg(["count", "sum"]).reset_index()
                g.insert(0, "rank", r)
                tables.append(g)
        if tables:
            pd.concat(tables).to_csv(os.path.join(out, "kernels_per_annotation.csv"), index=False)

    def annotations():
        df = a.get_gpu_user_annotation_breakdown(visualize=False)
        if df is not None:
            df.to_csv(os.path.join(out, "gpu_user_annotation_breakdown.csv"), index=False)

    if a is not None:
        step("get_queue_length_summary", f"get_queue_length_summary(ranks={ranks}); "
             "get_time_spent_blocked_on_full_queue(get_queue_length_time_series(ranks))  # max_queue_length=1024",
             queue)
        step("get_memory_bw_summary", f"get_memory_bw_summary(ranks={ranks})", membw)
        step("get_potential_stragglers", "get_potential_stragglers()  # num_candidates=2, all steps", stragglers)
        step("time_series", f"get_queue_length_time_series(ranks={ranks}); "
             f"get_memory_bw_time_series(ranks={ranks})", series)
        step("get_gpu_user_annotation_breakdown", "get_gpu_user_annotation_breakdown(visualize=False)  "
             "# use_gpu_annotation=True, duration_ratio=0.8, num_kernels=1000", annotations)
        step("get_gpu_kernels_with_user_annotations", f"get_gpu_kernels_with_user_annotations(rank=r, "
             f"expand_names=True, shortern_names=False) for r in {ranks}", kernels_per_annotation)
        step("get_aten_op_kernels_and_delay", f"get_aten_op_kernels_and_delay(ranks={ranks})", aten)
    write_run_info(out, "run_info.json", trace_dir, ranks, steps)


def main(run=None) -> int:
    """Run ``run(trace_dir, out)`` (default: run_set) on every trace set under argv[1]."""
    src, dst = sys.argv[1], sys.argv[2]
    for root, dirs, files in sorted(os.walk(src)):
        dirs.sort()
        if any(f.endswith((".json", ".json.gz")) for f in files):
            rel = os.path.relpath(root, src)
            print(f"== {rel}", flush=True)
            (run or run_set)(root, os.path.join(dst, rel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
