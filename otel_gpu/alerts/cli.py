"""`otel-gpu alerts`: write the Prometheus rule file generated from the diagnosis thresholds, or check it."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..values import url_type

HELP = """Generate the Prometheus recording and alerting rules from the diagnosis thresholds (one source
of numbers for `otel-gpu diagnose` and the alerts; see docs/deploy.md#alerts).

  otel-gpu alerts                      write compose/prometheus-rules/otel-gpu.rules.yml
  otel-gpu alerts --out FILE           write FILE instead ('-': standard output)
  otel-gpu alerts --check              exit 1 when the file differs from what the code generates
  otel-gpu alerts --thresholds F.toml  with threshold overrides (the file `diagnose --thresholds` reads)

Windows and `for:` durations (90s, 5m, 1h) have defaults for production; tests shorten them.
Exit status: 0 done (or --check found no difference), 1 --check found a difference or the file
cannot be written, 2 bad flags or threshold file.
"""


def default_path() -> Path:
    """compose/prometheus-rules/otel-gpu.rules.yml of the source tree this package was loaded from."""
    return Path(__file__).resolve().parents[2] / "compose" / "prometheus-rules" / "otel-gpu.rules.yml"


def _duration(text: str) -> float:
    from ..diagnose.cli import parse_duration
    from ..errors import UsageError

    try:
        return parse_duration(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers) -> None:
    p = subparsers.add_parser("alerts", help="generate the Prometheus alerting rules (from the diagnosis thresholds)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="FILE", help="where the rules go (default: the compose stack's rule file)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out differs")
    p.add_argument("--thresholds", metavar="FILE", help="threshold overrides (.toml, .yaml)")
    d = p.add_argument_group("windows and durations (e.g. 90s, 5m, 1h)")
    d.add_argument("--window", type=_duration, default=300.0, metavar="DUR",
                   help="rate window of the per-rank series: steps, busy time, data_wait (default 5m)")
    d.add_argument("--periodic-window", type=_duration, default=3600.0, metavar="DUR",
                   help="checkpoint and eval shares (default 1h)")
    d.add_argument("--gpu-window", type=_duration, default=300.0, metavar="DUR",
                   help="GPU throttle and idle shares (default 5m)")
    d.add_argument("--error-window", type=_duration, default=900.0, metavar="DUR",
                   help="GPU XID / ECC counts increasing within it (default 15m)")
    d.add_argument("--fresh", type=_duration, default=90.0, metavar="DUR",
                   help="a series whose newest sample is older: its process is gone (default 90s)")
    d.add_argument("--lookback", type=_duration, default=3600.0, metavar="DUR",
                   help="a target seen within it and not fresh: missing (default 1h)")
    d.add_argument("--interval", type=_duration, default=None, metavar="DUR",
                   help="the groups' evaluation interval (default: Prometheus' global one)")
    d.add_argument("--for", dest="for_", type=_duration, default=None, metavar="DUR",
                   help="one `for:` for every alert (default: each alert's own, see docs/deploy.md)")
    p.add_argument("--prometheus-url", type=url_type(), default="http://127.0.0.1:9090", metavar="URL",
                   help="the Prometheus the runbook lines name (default %(default)s)")
    p.add_argument("--agent-scrape-job", default="otel-gpu-agent", metavar="NAME",
                   help="scrape job of agents read over --prometheus-port, for the `up` check (default %(default)s)")
    p.set_defaults(func=run)


def params_from(args):
    from .params import RuleParams

    p = RuleParams(window_s=args.window, periodic_window_s=args.periodic_window, gpu_window_s=args.gpu_window,
                   error_window_s=args.error_window, fresh_s=args.fresh, lookback_s=args.lookback,
                   interval_s=args.interval, prometheus_url=args.prometheus_url.rstrip("/"),
                   agent_scrape_job=args.agent_scrape_job)
    return p if args.for_ is None else p.with_for(args.for_)


def run(args) -> int:
    from .. import output
    from ..diagnose.thresholds import ThresholdError, load_thresholds
    from ..errors import UsageError
    from .render import render

    if not args.agent_scrape_job.strip() or not args.agent_scrape_job.isprintable():
        raise UsageError(f"--agent-scrape-job {args.agent_scrape_job!r}: expected a name without control characters")
    try:
        thresholds = load_thresholds(args.thresholds)
    except ThresholdError as exc:
        raise UsageError(str(exc)) from None
    text = render(thresholds, params_from(args))   # UsageError on parameters that cannot work together
    target = args.out or str(default_path())
    if args.check:
        if target == "-":
            raise UsageError("--check needs a file: --out FILE")
        try:
            current = Path(target).read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        if current != text:
            why = "missing" if current is None else "differs from what the code generates"
            print(f"{target}: {why}", file=sys.stderr)
            print("otel-gpu alerts: run `otel-gpu alerts` (with the same flags) and commit the rule file", file=sys.stderr)
            return 1
        print(f"{target} matches the code")
        return 0
    if target == "-":
        sys.stdout.write(text)
        return 0
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    print(output.write(target, text))
    return 0
