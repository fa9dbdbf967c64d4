"""`otel-gpu report RUN_DIR... [-o report.html]`: the HTML report of a recorded run.

Several directories are the nodes of one job (each node records its own); their series and
profiles are merged. Exit status: 0 written, 1 a directory holds no readable recording or the
file cannot be written, 2 bad arguments.
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
    from ..record.reader import RecordingError
    from .build import REPORT_NAME, summary_text, write_report

    dirs = [Path(d) for d in args.dirs]
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"{d}: no such directory")
    try:
        thresholds = load_thresholds(args.thresholds)
    except ThresholdError as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.output) if args.output else dirs[0] / REPORT_NAME
    try:
        built = write_report(dirs, out, thresholds)
    except RecordingError as exc:
        print(f"otel-gpu report: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"otel-gpu report: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(summary_text(built, out))
    return 0
