"""`otel-gpu dashboards`: regenerate the Grafana dashboards from code, or check the committed JSON."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..words import count

HELP = """Regenerate grafana/dashboards/*.json from the *.dashboard.py definitions next to them.

  otel-gpu dashboards                 write the JSON next to the definitions
  otel-gpu dashboards --out DIR       write it to DIR instead
  otel-gpu dashboards --check         exit 1 when the JSON in --out differs from the code
  otel-gpu dashboards --list-queries  print every PromQL / Pyroscope query (tab-separated)

Exit status: 0 done (or --check found no difference), 1 --check found a difference or the
JSON cannot be written, 2 bad flags or a definition that does not load.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("dashboards", help="generate the Grafana dashboards (grafanalib)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=Path, default=None,
                   help="folder holding *.dashboard.py (default: grafana/dashboards of this source tree)")
    p.add_argument("--out", type=Path, default=None, help="where the JSON goes (default: --src)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when the JSON differs")
    p.add_argument("--list-queries", action="store_true", help="print every query the dashboards run")
    p.set_defaults(func=run)


def run(args) -> int:
    import importlib.util

    from ..errors import UsageError
    from . import build

    if importlib.util.find_spec("grafanalib") is None:   # the `dashboards` extra
        raise UsageError("grafanalib is not installed (pip install 'otel-gpu[dashboards]')")
    src = args.src or build.default_dir()
    if not src.is_dir():
        raise UsageError(f"{src}: no such folder (give --src)")
    if not build.definitions(src):
        raise UsageError(f"{src}: no *{build.SUFFIX} files")
    out = args.out or src
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a folder")
    try:
        generated = build.generate(src)
    except build.DefinitionError as exc:   # a bad input file: one line naming it
        raise UsageError(" ".join(str(exc).split())) from None
    if args.list_queries:
        from .queries import queries

        for gen in generated:
            for q in queries(json.loads(gen.text)):
                print(f"{q.dashboard}\t{q.where}\t{q.kind}\t{q.expr}" + (f"\t{q.label}" if q.label else ""))
        return 0
    if args.check:
        problems = build.differences(generated, out)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("otel-gpu dashboards: run `otel-gpu dashboards` and commit the JSON", file=sys.stderr)
            return 1
        n = len(generated)
        print(f"{count(n, 'dashboard')} {'matches its definition' if n == 1 else 'match their definitions'}")
        return 0
    for path in build.write(generated, out):
        print(path)
    return 0
