"""Reference results of HolisticTraceAnalysis 0.5.0 for the analyses built on its call graph
(frequent CUDA kernel sequences).

HTA's call-graph code fails with pandas 3 / numpy 2 ("Cannot specify both 'axis' and
'index'/'columns'", "axis argument to unique is not supported for dtype object"), so these
references come from a second virtual environment with pandas < 3 and numpy < 2:

    python -m venv /tmp/hta2 && /tmp/hta2/bin/pip install HolisticTraceAnalysis==0.5.0 pandas==2.2.3 'numpy<2'
    /tmp/hta2/bin/python tests/data/hta_extra/make_reference_callgraph.py ../shared/data/traces tests/data/hta_extra
    /tmp/hta2/bin/python tests/data/hta_extra/make_reference_callgraph.py BUILT tests/data/hta_extra/built

(BUILT: the output folder of make_sets.py.) For every trace set under the first argument it
writes, under the same relative path in the second, kernel_sequences.csv: HTA's
``get_frequent_cuda_kernel_sequences(operator_name=OP, min_pattern_len=N, rank=r)`` table for
every rank and each (OP, N) of CALLS, one row per pattern in HTA's order (count descending,
then pattern), with the pattern's SHA-1 (the pattern itself only when under 2,000 characters:
a ProfilerStep pattern lists every kernel of a step) and its number of kernels; and
kernel_sequences_run_info.json with each call, its wall time, peak memory and its error (HTA
raises on some sets; the error is the reference then).
"""
import csv
import hashlib
import json
import os
import platform
import resource
import sys
import tempfile
import time
import traceback

CALLS = [("ProfilerStep", 3), ("##", 3), ("autograd::engine", 3), ("autograd::engine", 1), ("Optimizer", 3),
         ("aten::", 3), ("aten::mm", 3), ("aten::copy_", 2)]
COLUMNS = ["operator", "min_pattern_len", "rank", "pattern", "pattern_sha1", "kernels", "count",
           "gpu_kernel_duration_us", "cpu_op_duration_us"]
MAX_PATTERN_CHARS = 2000


def run_set(trace_dir: str, out: str) -> None:
    import hta  # noqa: F401
    import pandas as pd
    import plotly.graph_objects as go

    go.Figure.show = lambda self, *a, **k: None
    from hta.trace_analysis import TraceAnalysis

    os.makedirs(out, exist_ok=True)
    steps, rows = [], []
    scratch = tempfile.mkdtemp(prefix="hta-overlaid-")

    def step(name, call, fn):
        t0 = time.perf_counter()
        err = None
        try:
            fn()
        except Exception as exc:  # HTA's own failure is part of the reference
            err = f"{exc.__class__.__name__}: {exc}".splitlines()[0][:300]
            traceback.print_exc()
        steps.append({"step": name, "call": call, "wall_s": round(time.perf_counter() - t0, 4), "error": err,
                      "self_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
        return err

    holder = {}
    if step("load", f"TraceAnalysis(trace_dir={trace_dir!r})",
            lambda: holder.setdefault("a", TraceAnalysis(trace_dir=trace_dir))):
        ranks = []
    else:
        ranks = sorted(holder["a"].t.traces)
    a = holder.get("a")

    def sequences(op, n, r):
        df = a.get_frequent_cuda_kernel_sequences(operator_name=op, output_dir=scratch, min_pattern_len=n,
                                                   rank=r, visualize=False)
        for rec in df.to_dict("records"):
            p = rec["pattern"]
            rows.append({"operator": op, "min_pattern_len": n, "rank": r,
                         "pattern": p if len(p) < MAX_PATTERN_CHARS else "",
                         "pattern_sha1": hashlib.sha1(p.encode()).hexdigest(), "kernels": p.count("|"),
                         "count": int(rec["count"]), "gpu_kernel_duration_us": int(rec["GPU kernel duration (us)"]),
                         "cpu_op_duration_us": int(rec["CPU op duration (us)"])})

    if a is not None:
        for op, n in CALLS:
            for r in ranks:
                step("get_frequent_cuda_kernel_sequences",
                     f"get_frequent_cuda_kernel_sequences(operator_name={op!r}, output_dir=TMP, "
                     f"min_pattern_len={n}, rank={r}, visualize=False)  # top_k=5",
                     lambda: sequences(op, n, r))
                steps[-1].update(operator=op, min_pattern_len=n, rank=r)
    with open(os.path.join(out, "kernel_sequences.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    info = {"trace_dir": trace_dir, "ranks": ranks, "hta_version": "0.5.0", "pandas": pd.__version__,
            "numpy": __import__("numpy").__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "steps": steps}
    json.dump(info, open(os.path.join(out, "kernel_sequences_run_info.json"), "w"), indent=1)


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    for root, dirs, files in sorted(os.walk(src)):
        dirs.sort()
        if any(f.endswith((".json", ".json.gz")) for f in files):
            rel = os.path.relpath(root, src)
            print(f"== {rel}", flush=True)
            run_set(root, os.path.join(dst, rel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
