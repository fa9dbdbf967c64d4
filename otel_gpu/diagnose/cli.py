"""`otel-gpu diagnose`: name the bottleneck of a training job's window, with evidence.

Reads the window's metrics from Prometheus (or VictoriaMetrics), and profiles from Pyroscope
when given, and prints findings ranked by the time at stake. Exit status: 0 diagnosed (whatever
was found; also when Pyroscope could not be read: the profile-based checks then say "not
checked" and why), 1 nothing to diagnose or Prometheus failed, 2 bad flags or threshold file.

Times (--from/--to): unix seconds, ISO 8601 (2025-01-31T10:00:00Z), `now` or `now-2h`.
Durations (--last): 90s, 15m, 1h, 2d. Thresholds: see docs/diagnose.md (TOML or YAML file).
The Grafana token may come from OTELGPU_GRAFANA_TOKEN instead of the command line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from datetime import datetime, timezone

from .. import words
from ..errors import UsageError
from ..values import positive_float, url_type

PYROSCOPE_TIMEOUT_S = 10.0   # profiles are optional: a slow Pyroscope costs at most this per request
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_DURATION_S = 100 * 365 * 86400.0    # a century: longer is a typo
MAX_TIME_S = 32503680000.0              # year 3000 in unix seconds


def parse_duration(text: str) -> float:
    """'90s', '15m', '1h', '2d', '1h30m' or plain seconds -> seconds (> 0, at most a century)."""
    s = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        value = float(s)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", s)
        if not parts or "".join(a + b for a, b in parts) != s:
            raise UsageError(f"duration {text!r}: expected e.g. 90s, 15m, 1h, 2d")
        value = sum(float(a) * _UNITS[b] for a, b in parts)
    if value <= 0:
        raise UsageError(f"duration {text!r} must be positive")
    if not value <= MAX_DURATION_S:   # also catches inf from a long run of digits
        raise UsageError(f"duration {text!r} is longer than a century")
    return value


def parse_time(text: str, now: float) -> float:
    """Unix seconds, ISO 8601 (naive = UTC), 'now' or 'now-<duration>' -> unix seconds,
    finite and between 1970 and the year 3000."""
    s = text.strip()
    if s == "now":
        return now
    if s.startswith("now-"):
        value = now - parse_duration(s[4:])
    elif re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", s):   # no nan, inf or 1_000
        value = float(s)
    else:
        try:
            dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            value = dt.timestamp()
        except (ValueError, OverflowError):
            raise UsageError(f"time {text!r}: expected unix seconds, ISO 8601 or now-1h") from None
    if not 0 <= value <= MAX_TIME_S:
        raise UsageError(f"time {text!r}: outside 1970 to the year 3000")
    return value


def window_bounds(args, now: float) -> tuple[float, float]:
    if args.last and (args.from_ or args.to):
        raise UsageError("give either --last or --from/--to, not both")
    if args.from_ or args.to:
        if not args.from_:
            raise UsageError("--to needs --from")
        start = parse_time(args.from_, now)
        end = parse_time(args.to, now) if args.to else now
    else:
        end = now
        start = end - parse_duration(args.last or "1h")
    if end <= start:
        raise UsageError("the window is empty: --to must be after --from")
    return start, end


def register(sub) -> None:
    p = sub.add_parser("diagnose", help="name the bottleneck of a training job, with evidence",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="*", metavar="RUN_DIR", help="a recorded run (otel-gpu run), one directory per node, "
                                                             "instead of --prometheus: the whole run is the window")
    p.add_argument("--prometheus", metavar="URL", type=url_type(), help="Prometheus (or VictoriaMetrics) base URL")
    p.add_argument("--pyroscope", metavar="URL", type=url_type(), help="Pyroscope base URL, for the communication rule")
    p.add_argument("--pyroscope-app", metavar="NAME", help="Pyroscope service name (default otelgpu.<job>)")
    p.add_argument("--job", help="the job (otelgpu_job label); default: every series in the window")
    p.add_argument("--from", dest="from_", metavar="T", help="window start")
    p.add_argument("--to", metavar="T", help="window end (default now)")
    p.add_argument("--last", metavar="DUR", help="window of this length ending now (default 1h)")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON ('-' for stdout)")
    p.add_argument("--markdown", metavar="OUT", help="write the report as Markdown ('-' for stdout)")
    p.add_argument("--tune-space", metavar="OUT", help="write the suggested `otel-gpu tune --space` file (JSON) of a "
                                                        "ZeRO communication finding")
    p.add_argument("--thresholds", metavar="FILE", help="threshold overrides (.toml, .yaml)")
    p.add_argument("--gpu-only", action="store_true", help="diagnose node/GPU metrics even without step metrics")
    p.add_argument("--grafana", metavar="URL", help="also write findings as Grafana annotations")
    p.add_argument("--grafana-token", metavar="TOKEN", help="Grafana service-account token (or OTELGPU_GRAFANA_TOKEN)")
    p.add_argument("--grafana-dashboard", metavar="UID", help="attach annotations to this dashboard only")
    p.add_argument("--timeout", type=positive_float(hi=3600), default=30.0,
                   help="seconds per server request (default 30)")
    w = p.add_argument_group("watching a running job (--watch)")
    w.add_argument("--watch", action="store_true",
                   help="evaluate the rules every --every seconds over the --last window (default 2m) until "
                        "interrupted; print a line when a finding appears, changes severity or clears")
    w.add_argument("--every", metavar="DUR", default="10s", help="--watch: time between evaluations (default 10s)")
    w.add_argument("--hold", metavar="DUR", default="60s",
                   help="--watch: a finding clears (or lowers its severity) only after this long without it "
                        "(default 60s)")
    w.add_argument("--min-severity", choices=("info", "warning", "critical"), default="info",
                   help="--watch: findings below this are not followed (default info)")
    p.set_defaults(func=run)


def _fail(msg: str) -> int:
    from ..safe_text import visible

    print(f"otel-gpu diagnose: {visible(msg)}", file=sys.stderr)   # it can quote a name from the data
    return 1


def run(args) -> int:
    from ..promql import PromClient, PromError
    from . import diagnose
    from .profiles import PyroscopeError, fetch_pyroscope
    from .thresholds import ThresholdError, load_thresholds
    from .window import DiagnoseError

    if bool(args.dirs) == bool(args.prometheus):
        raise UsageError("give either RUN_DIR... (a recorded run) or --prometheus URL")
    if args.watch:
        from .watch_cli import watch_main
        return watch_main(args)
    if args.dirs and (args.last or args.from_ or args.to or args.pyroscope or args.job):
        raise UsageError("with RUN_DIR the window is the whole recording: no --last/--from/--to/--pyroscope/--job")
    start, end = window_bounds(args, time.time()) if not args.dirs else (0.0, 0.0)
    try:
        thresholds = load_thresholds(args.thresholds)
    except ThresholdError as exc:
        raise UsageError(str(exc)) from None
    _check_outputs(args)
    token = args.grafana_token or os.environ.get("OTELGPU_GRAFANA_TOKEN")
    if args.grafana and not token:
        raise UsageError("--grafana needs a token: --grafana-token or OTELGPU_GRAFANA_TOKEN")
    if args.dirs:
        from ..record.diagnose import diagnose_recording
        from ..record.reader import RecordingError, RecordingVersionError
        try:
            result = diagnose_recording(args.dirs, thresholds=thresholds, require_steps=not args.gpu_only)
        except RecordingVersionError as exc:   # written by another otel-gpu: bad input
            raise UsageError(str(exc)) from None
        except (RecordingError, DiagnoseError) as exc:
            return _fail(str(exc))
        return _output(args, result, token)
    profile = profile_error = None
    if args.pyroscope:   # profiles are optional: without them the metric findings still print
        app = args.pyroscope_app or (f"otelgpu.{args.job}" if args.job else "otelgpu.train")
        try:
            profile = fetch_pyroscope(args.pyroscope, app, start, end, timeout=min(args.timeout, PYROSCOPE_TIMEOUT_S))
        except PyroscopeError as exc:
            profile_error = str(exc)
            print(f"otel-gpu diagnose: profiles not checked: {exc}", file=sys.stderr)
    with PromClient(args.prometheus, timeout=args.timeout) as client:
        try:
            result = diagnose(client, args.job, start, end, thresholds=thresholds, profile=profile,
                              profile_error=profile_error, require_steps=not args.gpu_only)
        except (PromError, DiagnoseError) as exc:
            return _fail(str(exc))
    return _output(args, result, token)


def _inputs(args) -> list[str]:
    """The files this command reads: no output may replace one of them."""
    from ..record.store import DB_NAME
    return [os.path.join(d, DB_NAME) for d in (args.dirs or ())] + ([args.thresholds] if args.thresholds else [])


def _outputs(args) -> list[tuple[str, str]]:
    """(flag, path) of every file output asked for ('-' is stdout, not a file)."""
    return [(flag, path) for flag, path in (("--json", args.json), ("--markdown", args.markdown),
                                            ("--tune-space", args.tune_space)) if path and path != "-"]


def _check_outputs(args) -> None:
    """Refuse an output that is a folder or one of the inputs, or two outputs to one file (the
    second would replace the first), before any work (exit 2)."""
    from .. import output
    inputs = _inputs(args)
    seen: dict[str, str] = {}
    for flag, path in _outputs(args):
        output.check(path, inputs, label=f"{flag} {path}")
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"{seen[real]} and {flag} name the same file {path}: give each its own")
        seen[real] = flag


def _output(args, result, token) -> int:
    from .. import output
    from . import report as rp
    from .annotations import AnnotationError, annotation_payloads, post_annotations

    inputs = _inputs(args)
    d = result.as_dict()
    outputs = {"json": json.dumps(d, indent=1, default=str) + "\n", "markdown": rp.markdown(d)}
    to_stdout = False
    for kind in ("json", "markdown"):
        path = getattr(args, kind)
        if path == "-":
            sys.stdout.write(outputs[kind])
            to_stdout = True
        elif path:
            try:
                output.write(path, outputs[kind], inputs, label=f"--{kind} {path}")
            except OSError as exc:
                return _fail(f"cannot write {path}: {exc.strerror or exc}")
    space = next((f["tune_space"] for f in d["findings"] if f["tune_space"]), None)
    if args.tune_space:
        if space is None:
            print("otel-gpu diagnose: no ZeRO communication finding: no tune space written", file=sys.stderr)
        else:
            try:
                output.write(args.tune_space, json.dumps(space, indent=1) + "\n", inputs,
                             label=f"--tune-space {args.tune_space}")
            except OSError as exc:
                return _fail(f"cannot write {args.tune_space}: {exc.strerror or exc}")
    if not to_stdout:
        from ..terminal import wrap_width
        sys.stdout.write(rp.text(d, width=wrap_width()))   # a terminal's width; a pipe: one line per item
    if args.grafana:
        try:
            n = post_annotations(args.grafana, token, annotation_payloads(d, args.grafana_dashboard), args.timeout)
        except AnnotationError as exc:
            return _fail(str(exc))
        print(f"otel-gpu diagnose: {words.count(n, 'annotation')} written to {args.grafana}", file=sys.stderr)
    return 0
