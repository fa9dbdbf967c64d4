"""`otel-gpu tune`: tune DeepSpeed ZeRO-3 settings with trials of your own launch command.

    otel-gpu tune --base-config ds_config.json --command 'torchrun ... --deepspeed {config}' \\
                  --trials 40 --prometheus http://prom:9090 --trial-timeout 1800 --hidden-size 4096

{config} is replaced by each trial's generated config ({trial_dir}, {trial}, {trial_id} too).
The base config is never modified. Results: <out>/trials/NNNN/ (config, command, log, result),
<out>/report.md, <out>/best_config.json. Run the same command again to resume a stopped study.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from ..safe_text import markup
from ..values import bounded_int, flag_type, number, positive_float, url_type

RUNNING_HELP = "time each trial may run before its whole process group is killed (seconds)"


def study_name(text: str) -> str:
    """argparse type: a study name, which also names its folder under otel-gpu-tune/: one safe
    folder-name component (the job-name folder rule, `identity.job_folder_name`), else refused."""
    from ..identity import job_folder_name

    if job_folder_name(text) != text:
        raise argparse.ArgumentTypeError(f"{text!r}: a study name names a folder under otel-gpu-tune/; use letters, "
                                         "digits, '_', '.' and '-' (not first: '.' or '-')")
    return text


def register(sub) -> None:
    p = sub.add_parser("tune", help="tune DeepSpeed ZeRO-3 settings by running trials of your launch command",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-config", required=True, type=Path, metavar="JSON", help="your DeepSpeed config (read only)")
    p.add_argument("--command", help="launch command with {config}; run through /bin/sh in a new process group")
    p.add_argument("--trials", type=bounded_int(1, 100_000), default=40, help="trials to finish in the study, baseline included (default 40)")
    p.add_argument("--prometheus", type=url_type(), metavar="URL", help="score from PromQL here (else from each trial's own "
                                                                       "recording, or with --no-instrument from the training log)")
    p.add_argument("--trial-timeout", type=positive_float(hi=30 * 86400.0), default=3600.0, metavar="SECONDS", help=RUNNING_HELP + " (default 3600)")
    p.add_argument("--study", metavar="PATH|URL", help="SQLite file or RDB URL shared by workers (default <out>/study.db)")
    p.add_argument("--study-name", type=study_name, help="study name within the storage (default: the base config's "
                                                           "file name); letters, digits, '_', '.', '-'")
    p.add_argument("--space", type=Path, metavar="YAML", help="narrow, fix, drop or extend the search space")
    p.add_argument("--out", type=Path, help="results folder (default otel-gpu-tune/<study name>)")
    g = p.add_argument_group("\"auto\" values (resolved as the Hugging Face Trainer does)")
    g.add_argument("--hidden-size", type=bounded_int(1), help="the model's hidden_size")
    g.add_argument("--model", type=Path, metavar="DIR", help="a Hugging Face model folder to read hidden_size from")
    g.add_argument("--micro-batch", type=bounded_int(1), help="per-device train batch size")
    g.add_argument("--grad-accum", type=bounded_int(1), help="gradient accumulation steps")
    g.add_argument("--world-size", type=bounded_int(1), help="ranks in the job (also checks batch arithmetic)")
    g.add_argument("--max-grad-norm", type=flag_type(number, lo=0.0), help="gradient clipping")
    g.add_argument("--precision", choices=("fp32", "fp16", "bf16"), help="fills fp16/bf16 \"enabled\"")
    g = p.add_argument_group("scoring and pruning")
    g.add_argument("--warmup-steps", type=bounded_int(0), default=3, help="steps left out of the step time (default 3)")
    g.add_argument("--min-steps", type=bounded_int(1), default=5, help="steps after warm-up a trial must show (default 5)")
    g.add_argument("--objective", type=_objectives, default=("step_time",), metavar="NAMES",
                   help="what trials are scored by, comma-separated: step_time (default), tokens_per_s, "
                        "tflops_per_gpu, joules_per_token; several: a multi-objective study (its Pareto front is "
                        "reported; slow trials are pruned only under step_time alone)")
    g.add_argument("--no-prune", action="store_true", help="never stop a slow trial early")
    g.add_argument("--prune-ratio", type=positive_float(lo=1.0, hi=1000.0), default=1.25, help="prune at this multiple of the best step time (default 1.25)")
    g.add_argument("--prune-after", type=bounded_int(1), default=5, metavar="STEPS",
                   help="steady steps a trial must show before it can be pruned (default 5)")
    g.add_argument("--poll", type=positive_float(hi=3600.0), default=2.0, metavar="SECONDS", help="how often a running trial is checked (default 2)")
    g.add_argument("--settle", type=flag_type(number, lo=0.0, hi=3600.0), default=15.0, metavar="SECONDS",
                   help="how long to wait for a finished trial's last samples to become queryable (default 15)")
    g.add_argument("--max-gpu-memory", type=positive_float(), metavar="GIB", help="a trial whose peak GPU memory exceeds this fails")
    g.add_argument("--evidence-selector", default="", metavar="LABELS",
                   help="label matchers for the evidence queries, e.g. 'host_name=~\"gpu-.*\"'")
    g = p.add_argument_group("trial environment")
    g.add_argument("--otlp", type=url_type(), metavar="URL", help="OTEL_EXPORTER_OTLP_ENDPOINT for the trials (else inherited)")
    g.add_argument("--no-instrument", action="store_true",
                   help="do not add the `otel-gpu run` hooks (the command instruments itself)")
    g.add_argument("--node-agent", dest="node_agent", action="store_true", default=None,
                   help="run the node agent (`otel-gpu agent`) beside each trial, exporting with the trial's id "
                        "(default: on when trials record themselves, i.e. without --prometheus)")
    g.add_argument("--no-node-agent", dest="node_agent", action="store_false",
                   help="never start a node agent (the evidence then comes from one you run, or says why not)")
    g.add_argument("--node-agent-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for that agent (repeatable), e.g. --node-agent-arg=--no-gpu")
    g.add_argument("--export-interval", type=bounded_int(10, 3_600_000), default=1000, metavar="MS",
                   help="OTEL_METRIC_EXPORT_INTERVAL for trials that do not set one (default 1000)")
    g.add_argument("--no-deepspeed-check", action="store_true", help="skip DeepSpeed's own config model check")
    g.add_argument("--prebuild-ops", type=_op_names, default=(), metavar="NAMES",
                   help="DeepSpeed op builders to build once before the first trial, comma-separated "
                        "(e.g. CPUAdamBuilder), so no trial is killed in a first JIT build")
    p.add_argument("--baseline-runs", type=bounded_int(1, 10), default=2, metavar="N",
                   help="run the baseline N times (the second after the known-good settings) to measure noise, "
                        "when --trials leaves at least two sampled trials besides (default 2)")
    p.add_argument("--keep-going", action="store_true",
                   help="run the other trials even when the baseline (your config unchanged) fails "
                        "(default: stop with its reason, exit 1)")
    p.add_argument("--seed", type=bounded_int(0, 2**32 - 1), help="sampler seed")
    p.add_argument("--report-only", action="store_true", help="write the report and best config of an existing study")
    p.set_defaults(func=run)


def _settings(args):
    from ..errors import UsageError
    from . import config as C
    from .space import Space, SpaceError, load_space
    from .study import Settings, default_study_name, storage_url
    from .trial import check_template

    if not args.base_config.exists():   # a pipe (`<(cat f)`) is read like a file
        raise UsageError(f"--base-config {args.base_config}: no such file")
    if args.base_config.is_dir():
        raise UsageError(f"--base-config {args.base_config}: a folder, not a file")
    if not args.report_only:
        if not args.command:
            raise UsageError("--command is required (the launch command, with {config})")
        problem = check_template(args.command)
        if problem:
            raise UsageError(f"--command: {problem}")
    try:
        space = load_space(args.space) if args.space else Space()
        hidden = args.hidden_size or (C.hidden_size_from_model(args.model) if args.model else None)
    except (SpaceError, C.ConfigError) as exc:
        raise UsageError(str(exc)) from None
    node_agent = _node_agent(args)
    name = args.study_name or default_study_name(args.base_config)
    out = args.out or Path("otel-gpu-tune") / name
    facts = C.Facts(hidden, args.micro_batch, args.grad_accum, args.world_size, args.max_grad_norm, args.precision)
    return Settings(
        base_config=args.base_config, command=args.command or "", trials=args.trials, out=out,
        storage=storage_url(args.study or out / "study.db"), study_name=name, space=space, facts=facts,
        timeout_s=args.trial_timeout, warmup=args.warmup_steps, min_steps=args.min_steps,
        prune=not args.no_prune, prune_ratio=args.prune_ratio, prune_min_steps=args.prune_after, poll_s=args.poll,
        max_memory_bytes=args.max_gpu_memory * 2**30 if args.max_gpu_memory else None,
        instrument=not args.no_instrument and (not args.prometheus or bool(args.otlp or _otlp_set(os.environ))),
        export_interval_ms=args.export_interval, otlp_endpoint=args.otlp,
        seed=args.seed, deepspeed_check=not args.no_deepspeed_check, prebuild_ops=args.prebuild_ops,
        node_agent=node_agent, node_agent_args=tuple(args.node_agent_arg), baseline_runs=args.baseline_runs,
        keep_going=args.keep_going, objectives=args.objective)


def _objectives(raw: str) -> tuple[str, ...]:
    """argparse type of --objective (scores.parse)."""
    from .scores import parse
    try:
        return parse(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _node_agent(args) -> bool:
    """Whether each trial gets its own node agent; UsageError where its readings could go nowhere."""
    from ..errors import UsageError

    records = not args.prometheus and not args.no_instrument
    exports = bool(args.otlp or _otlp_set(os.environ))
    enabled = records if args.node_agent is None else args.node_agent
    if enabled and not (records or exports):
        raise UsageError("--node-agent: its readings would go nowhere (no recording with --no-instrument; "
                         "give --otlp, or drop --no-instrument)")
    if args.node_agent_arg:
        if not enabled:
            raise UsageError("--node-agent-arg needs a node agent (--node-agent; it is off with --no-node-agent "
                             "and by default with --prometheus)")
        from ..run_cli import check_agent_args
        try:   # a bad flag: exit 2 now, not a study without evidence
            check_agent_args(args.node_agent_arg, os.environ)
        except UsageError as exc:
            raise UsageError(f"--node-agent-arg: {str(exc).removeprefix('--agent-arg: ')}") from None
    return enabled


def _op_names(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated Python identifiers (DeepSpeed op builder class names)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if not n.isidentifier()]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: expected op builder names such as CPUAdamBuilder")
    return names


def _otlp_set(env) -> bool:
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


def _objective(args):
    from ..errors import Failure
    from .objective import LogObjective, PromObjective

    if not args.prometheus:
        if args.no_instrument:          # nothing exported: the training log is all there is
            return LogObjective(args.warmup_steps)
        from .recorded import RecordingObjective
        return RecordingObjective(args.warmup_steps)
    from ..promql import PromClient, PromError

    client = PromClient(args.prometheus)
    try:
        client.query("vector(1)")
    except PromError as exc:   # the server is down or answers nonsense: a runtime failure
        raise Failure(str(exc)) from None
    fresh = 1.0 + 2 * args.export_interval / 1000     # the ranks' last export is at their exit
    return PromObjective(client, args.warmup_steps, args.evidence_selector, settle_s=args.settle, fresh_s=fresh,
                         trial_agent=_node_agent(args))


class Progress:
    """One line per trial start and end: number, status, step time, best so far, time left."""

    def __init__(self, tuner, console):
        self.tuner, self.console, self.t0, self.durations = tuner, console, time.monotonic(), []
        self.started = 0.0

    def __call__(self, kind, payload) -> None:
        from .report import changed_params, fmt_change, fmt_seconds

        total = self.tuner.s.trials
        if kind == "note":   # notes and reasons hold a trial's own output: shown, never obeyed as markup
            self.console.print(f"[yellow]{markup(payload)}[/]", highlight=False)
            return
        if kind == "start":
            self.started = time.monotonic()
            changed = changed_params(_P(payload["params"]), self.tuner.baseline)
            self.console.print(f"[bold]trial {payload['number']}[/] ({payload['role']}) started: {markup(changed)}",
                               highlight=False)
            return
        r = payload
        self.durations.append(time.monotonic() - self.started)
        done = self.tuner.counted()
        best = self.tuner.best()
        runs = [x.step_time_s for x in self.tuner.records + [r] if x.role == "baseline" and x.status == "ok" and x.step_time_s]
        base = sum(runs) / len(runs) if runs else None
        change = ("vs baseline " + fmt_change(r.step_time_s / base - 1)) if base and r.step_time_s and r.status == "ok" else ""
        left = max(0, total - done) * (sum(self.durations) / len(self.durations))
        colour = {"ok": "green", "pruned": "yellow"}.get(r.status, "red")
        self.console.print(
            f"[bold]trial {r.number}[/] [{done}/{total}] [{colour}]{r.status}[/] "
            f"step {fmt_seconds(r.step_time_s)} {change} | "
            f"{'best' if self.tuner.s.objectives == ('step_time',) else 'fastest'} "   # best: by --objective
            f"{fmt_seconds(best[0]) + f' (trial {best[1]})' if best else '-'} | "
            f"wall {r.seconds:.1f} s | left ~{_duration(left)}"
            + (f"\n    {markup(r.reason)}" if r.status not in ("ok",) else ""), highlight=False)


class _P:
    def __init__(self, params):
        self.params = params


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def run(args) -> int:
    from rich.console import Console

    from ..errors import UsageError
    try:
        import optuna
    except ImportError:
        raise UsageError("optuna is not installed (pip install 'otel-gpu[tune]')") from None
    from ..errors import Failure
    from ..words import count
    from . import config as C, report
    from .extensions import PrebuildError
    from .study import BaselineFailed, TuneError, Tuner, open_storage
    from .storage import shown_url

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings = _settings(args)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    if args.report_only:
        db = settings.storage[len("sqlite:///"):] if settings.storage.startswith("sqlite:///") else None
        if db and not Path(db).is_file():
            raise UsageError(f"no study storage at {db}")
        try:
            study = optuna.load_study(study_name=settings.study_name, storage=open_storage(settings.storage))
        except (KeyError, TuneError) as exc:
            raise UsageError(f"no study {settings.study_name!r} in {shown_url(settings.storage)}: {exc}") from None
        written = report.write_outputs(study, settings.out)
        console.print(report.terminal_table(study))
        console.print(f"report: {markup(str(written['report']))}")
        return 0
    tuner = Tuner(settings, _objective(args))
    tuner.events = Progress(tuner, console)
    try:
        tuner.prepare()
    except PrebuildError as exc:   # the op does not build here: a runtime failure
        raise Failure(str(exc)) from None
    except (TuneError, OSError, C.ConfigError) as exc:   # the base config, the study, the --out folder
        raise UsageError(getattr(exc, "strerror", None) and f"{exc.strerror}: {exc.filename}" or str(exc)) from None
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}   # as Ctrl-C
    failed = None
    console.print(f"study {markup(repr(settings.study_name))} in {markup(shown_url(settings.storage))}: {tuner.counted()} of "
                  f"{count(settings.trials, 'trial')} done; results in {markup(str(settings.out))}", highlight=False)
    try:
        tuner.run()
    except BaselineFailed as exc:   # a runtime failure: the report of what ran is still written below
        failed = Failure(str(exc))
    except TuneError as exc:
        raise UsageError(str(exc)) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        written = report.write_outputs(tuner.study, settings.out)
    console.print(report.terminal_table(tuner.study))
    lines = [f"report: {written['report']}"]
    if "best_config" in written:
        lines.append(f"best config: {written['best_config']}")
    console.print("\n".join(map(markup, lines)), highlight=False)
    if failed is not None:
        raise failed
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt
