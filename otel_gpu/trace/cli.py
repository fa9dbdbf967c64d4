"""`otel-gpu trace analyze DIR` and `otel-gpu trace diff A B`: PyTorch profiler (Kineto) trace analysis.

analyze: temporal breakdown, GPU kernel breakdown, idle time, communication/computation overlap,
kernel launch statistics, a cross-rank straggler summary and anti-pattern findings, with
HTA 0.5.0's semantics (see docs/trace.md). diff: per-op and per-kernel changes between runs.
"""
from __future__ import annotations

import argparse
import sys

from ..errors import UsageError


def _ranks(text: str) -> list[int]:
    try:
        out: list[int] = []
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = part.split("-", 1)
                out += list(range(int(lo), int(hi) + 1))
            elif part:
                out.append(int(part))
        return out
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad rank list {text!r} (e.g. 0,1,4-7)") from None


def register(sub) -> None:
    p = sub.add_parser("trace", help="analyse PyTorch profiler (Kineto) traces", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = p.add_subparsers(dest="trace_command", required=True)

    a = tsub.add_parser("analyze", help="analyse a folder of per-rank traces (.json / .json.gz)")
    a.add_argument("dir", help="folder with one trace file per rank")
    a.add_argument("--ranks", type=_ranks, default=None, help="only these ranks, e.g. 0,1,4-7")
    a.add_argument("--json", dest="json_out", metavar="OUT", help="write the full result as JSON")
    a.add_argument("--csv", dest="csv_dir", metavar="DIR", help="write one CSV per table into DIR")
    a.add_argument("--include-last-step", action="store_true",
                   help="keep kernels of the last ProfilerStep (HTA drops them by default)")
    a.add_argument("--top", type=int, default=10, help="rows of the top-kernel table (default 10)")
    a.add_argument("--jobs", type=int, default=None,
                   help="processes reading files (default: one per core for sets over 4 MB, else 1)")
    a.add_argument("--num-kernels", type=int, default=10, help="kernels kept per rank and type (HTA: 10)")
    a.add_argument("--duration-ratio", type=float, default=0.8,
                   help="kernels past this share of cumulative time go to 'others' (HTA: 0.8)")
    a.add_argument("--kernel-delay", type=float, default=30,
                   help="gap (us) under which idle time is kernel wait (HTA: 30)")
    a.add_argument("--runtime-cutoff", type=float, default=50, help="launch call (us) counted as outlier (HTA: 50)")
    a.add_argument("--launch-delay-cutoff", type=float, default=100,
                   help="launch delay (us) counted as outlier (HTA: 100)")
    a.add_argument("--quiet", action="store_true", help="no terminal tables")
    a.set_defaults(func=run_analyze)

    d = tsub.add_parser("diff", help="what changed between two runs (per op and per kernel)")
    d.add_argument("a", help="baseline trace folder")
    d.add_argument("b", help="new trace folder")
    d.add_argument("--json", dest="json_out", metavar="OUT", help="write the diff as JSON")
    d.add_argument("--csv", dest="csv_dir", metavar="DIR", help="write trace_diff.csv into DIR")
    d.add_argument("--top", type=int, default=20, help="rows shown in the terminal (default 20)")
    d.add_argument("--quiet", action="store_true", help="no terminal table")
    d.set_defaults(func=run_diff)


def _load(path: str, ranks=None, include_last_step: bool = False, jobs: int | None = None):
    from .model import load_set  # numpy-based modules are imported when the command runs
    from .parse import TraceFormatError

    try:
        return load_set(path, ranks, include_last_step, jobs)
    except TraceFormatError as exc:
        raise UsageError(str(exc)) from None


def _console():
    from rich.console import Console

    return Console(file=sys.stdout, width=160)


def run_analyze(args) -> int:
    from .analyze import Options, analyze
    from .report import csv_files, render_analysis, write_outputs

    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if args.num_kernels < 1 or not 0 < args.duration_ratio <= 1:
        raise UsageError("--num-kernels must be >= 1 and --duration-ratio in (0, 1]")
    opts = Options(num_kernels=args.num_kernels, duration_ratio=args.duration_ratio,
                   consecutive_kernel_delay=args.kernel_delay, runtime_cutoff=args.runtime_cutoff,
                   launch_delay_cutoff=args.launch_delay_cutoff)
    opts.thresholds.runtime_cutoff_us = args.runtime_cutoff
    ts = _load(args.dir, args.ranks, args.include_last_step, args.jobs)
    doc = analyze(ts, opts)
    write_outputs(args.json_out, doc, args.csv_dir, csv_files(doc) if args.csv_dir else None)
    if not args.quiet:
        render_analysis(doc, _console(), top=args.top)
    return 0


def run_diff(args) -> int:
    from .diff import diff_sets
    from .report import diff_csv, render_diff, write_outputs

    a = _load(args.a)
    b = _load(args.b)
    doc = diff_sets(a, b)
    write_outputs(args.json_out, doc, args.csv_dir, diff_csv(doc) if args.csv_dir else None)
    if not args.quiet:
        render_diff(doc, _console(), top=args.top)
    return 0
