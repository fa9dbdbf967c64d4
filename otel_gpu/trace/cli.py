"""`otel-gpu trace analyze DIR` and `otel-gpu trace diff A B`: PyTorch profiler (Kineto) trace analysis.

analyze: temporal breakdown, GPU kernel breakdown, idle time, communication/computation overlap,
kernel launch statistics, frequent kernel sequences (on request), a cross-rank straggler
summary and anti-pattern findings, with
HTA 0.5.0's semantics (see docs/trace.md). diff: per-op and per-kernel changes between runs.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from .. import words
from ..errors import UsageError


_RANK_PART = re.compile(r"(\d{1,9})(?:\s*-\s*(\d{1,9}))?", re.ASCII)
MAX_RANK = 1 << 20  # more ranks than any job has; a typo like 0-10000000 is refused early


def _ranks(text: str) -> list[int]:
    """``0,1,4-7`` -> [0, 1, 4, 5, 6, 7] (sorted, unique); ranks from 0 to MAX_RANK."""
    bad = argparse.ArgumentTypeError(f"bad rank list {text[:40]!r} (e.g. 0,1,4-7; ranks 0 to {MAX_RANK})")
    out: set[int] = set()
    for part in text.split(","):
        m = _RANK_PART.fullmatch(part.strip())
        if m is None:
            raise bad
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo or hi > MAX_RANK:
            raise bad
        out.update(range(lo, hi + 1))
    return sorted(out)


def _int_in(lo: int, hi: int = 1_000_000):
    """A flag parser for an integer from ``lo`` to ``hi``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"must be {lo} to {hi}, got {n}")
        return n
    return parse


_count = _int_in(1)  # a positive count
_index = _int_in(0)  # a position from 0


def _micros(text: str) -> float:
    """A finite, non-negative time in microseconds."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not 0 <= x < 1e15:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be a finite number of microseconds >= 0, got {text[:40]!r}")
    return x


def _ratio(text: str) -> float:
    """A share in (0, 1]."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text[:40]!r}")
    return x


def _percent(text: str) -> float:
    """A share in percent, 0 to 100."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not 0 <= x <= 100:
        raise argparse.ArgumentTypeError(f"must be a percentage from 0 to 100, got {text[:40]!r}")
    return x


MAX_OPERATOR_CHARS = 1000


def _operator(text: str) -> str:
    """An operator name (substring) for --kernel-sequences: non-empty, one line, 1,000 characters at most."""
    if not text or "\n" in text or len(text) > MAX_OPERATOR_CHARS:
        raise argparse.ArgumentTypeError(f"need a non-empty operator name of one line, at most {MAX_OPERATOR_CHARS} "
                                         f"characters (e.g. ProfilerStep, autograd::engine), got {text[:40]!r}")
    return text


def _annotation(text: str) -> str:
    """An event-name fragment: printable, at most 200 characters (empty: the whole trace)."""
    if len(text) > 200 or not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be printable text of at most 200 characters, got {text[:40]!r}")
    return text


def input_files(*dirs: str) -> list[str]:
    """The trace files of the folders (none for one that cannot be listed: reading it says why)."""
    from .listing import list_traces

    out: list[str] = []
    for d in dirs:
        try:
            out += list_traces(d)[0]
        except OSError:
            continue
    return out


def check_outputs(json_path: str | None, csv_dir: str | None, inputs: list[str] = ()) -> None:
    """Refuse output paths that cannot be written, or that are one of the input traces, before any
    work: UsageError naming the flag."""
    from .. import output

    if json_path:
        output.check(json_path, inputs, label=f"--json {json_path}")
    if csv_dir:
        check_folder("--csv", csv_dir)


def check_folder(flag: str, folder: str) -> None:
    """Refuse an output folder that is a file or whose parent is missing or not writable (UsageError)."""
    parent = os.path.dirname(os.path.abspath(folder))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"{flag} {folder}: exists and is not a folder")
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {folder}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {folder}: folder {parent} is not writable")


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
    a.add_argument("--top", type=_count, default=10, help="rows of the top-kernel table (default 10)")
    a.add_argument("--jobs", type=_count, default=None,
                   help="processes reading files and analysing ranks "
                        "(default: one per core for sets over 1 MB, else 1)")
    a.add_argument("--num-kernels", type=_count, default=10, help="kernels kept per rank and type (HTA: 10)")
    a.add_argument("--duration-ratio", type=_ratio, default=0.8,
                   help="kernels past this share of cumulative time go to 'others' (HTA: 0.8)")
    a.add_argument("--kernel-delay", type=_micros, default=30,
                   help="gap (us) under which idle time is kernel wait (HTA: 30)")
    a.add_argument("--runtime-cutoff", type=_micros, default=50, help="launch call (us) counted as outlier (HTA: 50)")
    a.add_argument("--launch-delay-cutoff", type=_micros, default=100,
                   help="launch delay (us) counted as outlier (HTA: 100)")
    a.add_argument("--min-impact", type=_percent, default=1.0, metavar="PCT",
                   help="report a finding only when its time at stake is at least PCT %% of the span analysed "
                        "(GPU span; steps on CPU-only traces); default 1")
    a.add_argument("--kernel-sequences", type=_operator, action="append", default=None, metavar="OP",
                   help="frequent kernel sequences launched under CPU ops whose name contains OP (HTA's "
                        "operator_name, e.g. ProfilerStep, autograd::engine); repeat for several")
    a.add_argument("--min-pattern-len", type=_count, default=None, metavar="N",
                   help="with --kernel-sequences: only ops launching at least N kernels (HTA: 3)")
    a.add_argument("--top-k", type=_count, default=None, metavar="N",
                   help="with --kernel-sequences: patterns shown per operator in the terminal (HTA: 5; "
                        "JSON and CSV have all)")
    a.add_argument("--critical-path-annotation", metavar="TEXT", type=_annotation, default="ProfilerStep",
                   help="critical path window: an event whose name contains TEXT (default ProfilerStep); "
                        "the whole trace when no event matches")
    a.add_argument("--critical-path-step", metavar="N", type=_index, default=None,
                   help="which matching event, from 0 (default: 1 when there are two or more, else 0)")
    a.add_argument("--no-critical-path", action="store_true", help="skip the critical path analysis")
    a.add_argument("--quiet", action="store_true", help="print the findings only (no tables, no notes)")
    a.add_argument("--verbose", action="store_true",
                   help="also print the notes that matter only to compare figures with HTA's (always in --json)")
    a.set_defaults(func=run_analyze)
    from .gpu_flame_cli import add_arguments as gpu_time_arguments   # --folded, --push: GPU time by code
    gpu_time_arguments(a)

    d = tsub.add_parser("diff", help="what changed between two runs (per op and per kernel)")
    d.add_argument("a", help="baseline trace folder")
    d.add_argument("b", help="new trace folder")
    d.add_argument("--json", dest="json_out", metavar="OUT", help="write the diff as JSON")
    d.add_argument("--csv", dest="csv_dir", metavar="DIR", help="write trace_diff.csv into DIR")
    d.add_argument("--top", type=_count, default=20, help="rows shown in the terminal (default 20)")
    d.add_argument("--quiet", action="store_true", help="print nothing (with --json or --csv)")
    d.set_defaults(func=run_diff)

    from .capture_cli import register as register_capture   # `trace capture`: a running job's next steps
    register_capture(tsub)


def _load(path: str, ranks=None, include_last_step: bool = False, jobs: int | None = None, meanwhile=None):
    from .model import load_set  # numpy-based modules are imported when the command runs
    from .parse import TraceFormatError

    try:
        return load_set(path, ranks, include_last_step, jobs, meanwhile)
    except TraceFormatError as exc:
        raise UsageError(str(exc)) from None


def _write(args, doc: dict, files: dict[str, str] | None, inputs: list[str]) -> bool:
    """Write the outputs; a failure while writing (disk full, permissions changed) is a runtime
    failure: one line on stderr, nothing half-written left behind, False."""
    from .report import write_outputs

    try:
        n = write_outputs(args.json_out, doc, args.csv_dir, files, inputs)
    except OSError as exc:
        print(f"otel-gpu trace: cannot write outputs: {exc.strerror or exc} ({exc.filename or ''})",
              file=sys.stderr)
        return False
    wrote = ([f"--json {os.path.abspath(args.json_out)}"] if args.json_out else []) + (
        [f"{words.count(n, 'CSV file')} in {os.path.abspath(args.csv_dir)}"] if args.csv_dir and n else [])
    if wrote:   # on stderr: stdout holds the tables (or the findings only)
        print(f"otel-gpu trace: wrote {'; '.join(wrote)}", file=sys.stderr)
    return True


def _console():
    """The terminal at the width rich detects (its size; else COLUMNS; else 80 columns)."""
    from ..terminal import console

    return console()


def _import_analysis() -> None:
    """Import what the analyses and the output need: run while worker processes read the traces."""
    import rich.console  # noqa: F401

    from . import analyze, report  # noqa: F401


def run_analyze(args) -> int:
    inputs = input_files(args.dir)
    check_outputs(args.json_out, args.csv_dir, inputs)
    from . import gpu_flame_cli
    gpu_flame_cli.check(args)
    if not args.kernel_sequences and (args.min_pattern_len is not None or args.top_k is not None):
        raise UsageError("--min-pattern-len and --top-k need --kernel-sequences OP")
    from ..safe_text import visible
    from .analyze import Options
    from .parse import TraceFormatError
    from .report_files import RankFileStage, StageFailed
    from .set_workers import WorkerFailed, analyze_folder

    opts = Options(num_kernels=args.num_kernels, duration_ratio=args.duration_ratio,
                   consecutive_kernel_delay=args.kernel_delay, runtime_cutoff=args.runtime_cutoff,
                   launch_delay_cutoff=args.launch_delay_cutoff,
                   kernel_sequences=tuple(dict.fromkeys(args.kernel_sequences or ())),
                   min_pattern_len=args.min_pattern_len or 3, critical_path=not args.no_critical_path,
                   critical_path_annotation=args.critical_path_annotation,
                   critical_path_instance=args.critical_path_step)
    opts.thresholds.runtime_cutoff_us = args.runtime_cutoff
    opts.thresholds.min_time_share_pct = args.min_impact
    # GPU time by launching code, per rank (not made for --quiet alone: nothing shows it)
    want_gpu_time = bool(not args.quiet or args.json_out or args.folded_dir or args.push_url)
    stage = None   # with --csv, each rank's own CSV files are staged where the rank is analysed
    try:
        if args.csv_dir:
            stage = RankFileStage(args.csv_dir, inputs)
        doc = analyze_folder(args.dir, opts, args.ranks, args.include_last_step, args.jobs, keep_file=stage,
                             gpu_time=want_gpu_time, meanwhile=_import_analysis)
        gpu_time = doc.pop("_gpu_time") if want_gpu_time else None
        if gpu_time is not None:
            doc["gpu_time_by_code"] = gpu_flame_cli.summary(gpu_time)
        from .report import csv_files, render_analysis, render_findings   # (imported while the workers read)
        if not _write(args, doc, csv_files(doc) if args.csv_dir else None, inputs):
            return 1
    except TraceFormatError as exc:
        raise UsageError(str(exc)) from None
    except WorkerFailed as exc:
        print(f"otel-gpu trace: {visible(str(exc))}", file=sys.stderr)
        return 1
    except StageFailed as exc:   # the --csv folder cannot be made, or a rank's file cannot be staged
        print(f"otel-gpu trace: cannot write outputs: {exc.strerror or exc} ({exc.filename or ''})",
              file=sys.stderr)
        return 1
    finally:
        if stage is not None:
            stage.close()
    if args.quiet:
        render_findings(doc, _console())
    else:
        render_analysis(doc, _console(), top=args.top, sequences_top=args.top_k or 5, verbose=args.verbose)
    return gpu_flame_cli.finish(args, gpu_time, inputs)


def run_diff(args) -> int:
    from .diff import diff_sets
    from .report import diff_csv, render_diff

    inputs = input_files(args.a, args.b)
    check_outputs(args.json_out, args.csv_dir, inputs)
    a = _load(args.a)
    b = _load(args.b)
    doc = diff_sets(a, b)
    if not _write(args, doc, diff_csv(doc) if args.csv_dir else None, inputs):
        return 1
    if not args.quiet:
        render_diff(doc, _console(), top=args.top)
    return 0
