"""`otel-gpu report RUN_DIR... [-o report.html]`: the HTML report of a recorded run.

Several directories are the nodes of one job (each node records its own); their series and
profiles are merged. Exit status: 0 written, 1 a directory holds no readable recording or the
file cannot be written (a full disk), 2 bad arguments, a recording of another format version, or an
output that is a folder or one of the recordings.

The output is written by the rules of every otel-gpu output (docs/record.md, "Outputs"): a file is
replaced whole and keeps its mode and owner, a link is followed, /dev/null, /dev/stdout and named
pipes are written through.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError


def register(sub) -> None:
    p = sub.add_parser("report", help="write the HTML report of a recorded run (otel-gpu run)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="RUN_DIR", help="recorded run directory (one per node)")
    p.add_argument("-o", "--output", metavar="FILE", help="the HTML file (default RUN_DIR/report.html)")
    p.add_argument("--thresholds", metavar="FILE", help="diagnosis threshold overrides (.toml, .yaml)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..diagnose.thresholds import ThresholdError, load_thresholds
    from ..record.reader import RecordingError, RecordingVersionError
    from .. import output
    from .build import REPORT_NAME, input_files, summary_text, write_report

    dirs = [Path(d) for d in args.dirs]
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"{d}: no such directory")
    try:
        thresholds = load_thresholds(args.thresholds)
    except ThresholdError as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.output) if args.output else dirs[0] / REPORT_NAME
    inputs = [*input_files(dirs), *([args.thresholds] if args.thresholds else [])]
    output.check(out, inputs, label=f"-o {out}" if args.output else None)   # before any work: exit 2
    try:
        built = write_report(dirs, out, thresholds, inputs)
    except RecordingVersionError as exc:
        raise UsageError(str(exc)) from None
    except RecordingError as exc:
        print(f"otel-gpu report: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"otel-gpu report: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(summary_text(built, out))
    return 0
