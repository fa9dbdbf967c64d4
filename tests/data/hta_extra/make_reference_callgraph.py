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
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import load_analysis, main, step_recorder, write_run_info  # noqa: E402

CALLS = [("ProfilerStep", 3), ("##", 3), ("autograd::engine", 3), ("autograd::engine", 1), ("Optimizer", 3),
         ("aten::", 3), ("aten::mm", 3), ("aten::copy_", 2)]
COLUMNS = ["operator", "min_pattern_len", "rank", "pattern", "pattern_sha1", "kernels", "count",
           "gpu_kernel_duration_us", "cpu_op_duration_us"]
MAX_PATTERN_CHARS = 2000


def run_set(trace_dir: str, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    steps: list = []
    rows: list = []
    step = step_recorder(steps)
    a, ranks = load_analysis(trace_dir, step)
    scratch = tempfile.mkdtemp(prefix="hta-overlaid-")  # HTA writes its overlaid trace there

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
    write_run_info(out, "kernel_sequences_run_info.json", trace_dir, ranks, steps)


if __name__ == "__main__":
    sys.exit(main(run_set))
