"""`otel-gpu diagnose --watch`: the flags, the outputs and the signals around watch.Watcher.

Text: one line per event on stdout, status lines (waiting for data, backend down / back) on stderr.
`--json -`: one JSON object per event per line on stdout instead of text; `--json FILE` appends
them to FILE as they happen. Runs until SIGINT or SIGTERM (exit 0), or until a watched recording
has ended; exit 2 for bad flags.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Callable

from ..errors import UsageError


def _durations(args) -> tuple[float, float, float]:
    from .cli import parse_duration
    every, hold = parse_duration(args.every), parse_duration(args.hold)
    last = parse_duration(args.last) if args.last else None
    if not 0.5 <= every <= 3600:
        raise UsageError(f"--every {args.every}: expected 0.5 s to 1 h")
    if hold > 7 * 86400:
        raise UsageError(f"--hold {args.hold}: at most a week")
    return every, hold, last if last is not None else 0.0


def watch_main(args) -> int:
    from .thresholds import ThresholdError, load_thresholds
    from .watch import DEFAULT_LAST_S, PromSource, RecordingSource, Watcher, run_until
    from .watch_state import Tracker

    if args.from_ or args.to:
        raise UsageError("--watch follows the window ending now: give --last, not --from/--to")
    if args.markdown or args.tune_space:
        raise UsageError("--watch writes events (text or --json), not --markdown or --tune-space")
    if args.dirs and (args.pyroscope or args.job):
        raise UsageError("with RUN_DIR the job is the recording's: no --job or --pyroscope")
    every, hold, last = _durations(args)
    last = last or DEFAULT_LAST_S
    try:
        thresholds = load_thresholds(args.thresholds)
    except ThresholdError as exc:
        raise UsageError(str(exc)) from None
    token = args.grafana_token or os.environ.get("OTELGPU_GRAFANA_TOKEN")
    if args.grafana and not token:
        raise UsageError("--grafana needs a token: --grafana-token or OTELGPU_GRAFANA_TOKEN")
    json_out = _json_sink(args.json)
    emit = _emitter(json_out, args, token)
    say = _say
    if args.dirs:
        source = RecordingSource(args.dirs, last, require_steps=not args.gpu_only)
    else:
        source = PromSource(args.prometheus, args.job, last, args.timeout, require_steps=not args.gpu_only)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):   # kept until the process exits: a late signal is no crash
        signal.signal(s, lambda *_: stop.set())
    watcher = Watcher(source, thresholds, Tracker(hold_s=hold, min_severity=args.min_severity), emit, say)
    try:
        run_until(watcher, every, stop.wait)
    finally:
        source.close()
        if json_out not in (None, sys.stdout):
            json_out.close()
    return 0


def _say(line: str) -> None:
    from ..safe_text import visible
    print(f"otel-gpu diagnose: {visible(line)}", file=sys.stderr, flush=True)


def _json_sink(path: str | None):
    """Where JSON events go: None, stdout ('-') or FILE opened to append (a folder or device refused)."""
    if not path:
        return None
    if path == "-":
        return sys.stdout
    if os.path.isdir(path) or (os.path.exists(path) and not os.path.isfile(path)):
        raise UsageError(f"--json {path}: not a regular file")
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--json {path}: cannot write: {exc.strerror or exc}") from None


def _emitter(json_out, args, token: str | None) -> Callable[[dict], None]:
    from .watch import event_line

    def emit(e: dict) -> None:
        if json_out is not None:
            json_out.write(json.dumps(e, default=str, ensure_ascii=True) + "\n")
            json_out.flush()
        if json_out is not sys.stdout:
            print(event_line(e), flush=True)
        if args.grafana and e["event"] == "appeared":
            _annotate(args, token, e)
    return emit


def _annotate(args, token: str, e: dict) -> None:
    """The appearing finding as a Grafana annotation from its start to now; a failure is one line."""
    from .annotations import AnnotationError, annotation_payloads, post_annotations
    start = e.get("since") or e["t"]
    report = {"job": args.job, "start": start, "end": e["t"], "findings": [{**e, "ranges": []}]}
    try:
        post_annotations(args.grafana, token, annotation_payloads(report, args.grafana_dashboard), args.timeout)
    except AnnotationError as exc:
        _say(f"annotation not written: {exc}")
