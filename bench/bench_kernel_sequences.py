"""Frequent CUDA kernel sequences: `otel-gpu trace analyze --kernel-sequences OP` against
HolisticTraceAnalysis 0.5.0's ``get_frequent_cuda_kernel_sequences``, side by side, same traces.

    python bench/bench_kernel_sequences.py [--hta-venv /tmp/hta2] [--ranks 2,8,64] [--op autograd::engine]

HTA's call graph needs pandas < 3 and numpy < 2; its venv is made when missing. HTA takes one rank
per call: its run is `TraceAnalysis(trace_dir=DIR)` then the call for every rank, writing each
table. Ours is the whole `python -m otel_gpu.trace analyze DIR --kernel-sequences OP --csv OUT
--quiet` (every other analysis included). Wall time end to end and peak RSS (GNU time) of fresh
processes; then every (rank, pattern, count, GPU time, CPU time) row is compared. Multi-rank sets
replicate the ranks of hta_sampled_2rank (as bench_trace.py does).
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_trace import ROOT, measure, replicate  # noqa: E402

HTA_SCRIPT = r"""
import csv, sys, tempfile
from hta.trace_analysis import TraceAnalysis
d, op, out = sys.argv[1], sys.argv[2], sys.argv[3]
a = TraceAnalysis(trace_dir=d)
scratch = tempfile.mkdtemp()
with open(out, "w", newline="") as fh:
    w = csv.writer(fh)
    w.writerow(["rank", "pattern", "count", "gpu_kernel_duration_us", "cpu_op_duration_us"])
    for r in sorted(a.t.traces):
        df = a.get_frequent_cuda_kernel_sequences(operator_name=op, output_dir=scratch, rank=r, visualize=False)
        for rec in df.to_dict("records"):
            w.writerow([r, rec["pattern"], rec["count"], rec["GPU kernel duration (us)"], rec["CPU op duration (us)"]])
"""
KEY = ("rank", "pattern", "count", "gpu_kernel_duration_us", "cpu_op_duration_us")


def ensure_hta(venv: str) -> str:
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py) or subprocess.run([py, "-c", "import hta"], capture_output=True).returncode:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "HolisticTraceAnalysis==0.5.0", "pandas==2.2.3",
                        "numpy<2"], check=True)
    return py


def _rows(path: str) -> list[tuple]:
    with open(path) as fh:
        return [tuple(str(float(r[k])) if k.endswith("_us") or k == "count" else r[k] for k in KEY)
                for r in csv.DictReader(fh)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "traces"))
    ap.add_argument("--hta-venv", default="/tmp/hta2")
    ap.add_argument("--ranks", default="2,8,64", help="sizes made from hta_sampled_2rank")
    ap.add_argument("--op", default="autograd::engine", help="operator name (substring), as HTA's operator_name")
    args = ap.parse_args()
    hta_py = ensure_hta(args.hta_venv)
    src = os.path.join(args.data, "hta_sampled_2rank")
    work = tempfile.mkdtemp(prefix="bench-seq-")
    print(f"ours: python -m otel_gpu.trace analyze DIR --kernel-sequences {args.op} --csv OUT --quiet; "
          f"HTA 0.5.0: {hta_py}, get_frequent_cuda_kernel_sequences per rank")
    print(f"{'ranks':>5} {'HTA s':>8} {'ours s':>8} {'speedup':>8} {'HTA MB':>8} {'ours MB':>8} {'mem ratio':>9}  numbers")
    ok = True
    for n in [int(x) for x in args.ranks.split(",") if x]:
        d = src if n == 2 else replicate(src, n, os.path.join(work, f"rep{n}"))
        hta_csv, ours_dir = os.path.join(work, f"hta{n}.csv"), os.path.join(work, f"ours{n}")
        h = measure([hta_py, "-c", HTA_SCRIPT, d, args.op, hta_csv], dict(os.environ, PYTHONWARNINGS="ignore"))
        o = measure([sys.executable, "-m", "otel_gpu.trace", "analyze", d, "--kernel-sequences", args.op,
                     "--csv", ours_dir, "--quiet"], dict(os.environ, PYTHONPATH=ROOT))
        if h[2] or o[2]:
            raise SystemExit(f"a run failed on {n} ranks (HTA exit {h[2]}, ours exit {o[2]})")
        want, got = _rows(hta_csv), _rows(os.path.join(ours_dir, "kernel_sequences.csv"))
        same = want == got and len(want) > 0
        ok &= same
        print(f"{n:>5} {h[0]:>8.2f} {o[0]:>8.2f} {h[0] / o[0]:>7.1f}x {h[1]:>8.0f} {o[1]:>8.0f} {o[1] / h[1]:>9.2f}  "
              f"{'identical' if same else 'DIFFER'} ({len(want)} rows)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
