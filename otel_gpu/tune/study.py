"""The tuning loop: Optuna ask/tell over SQLite (or any RDB URL, shared by workers on several nodes).

Resume (storage.py): a RUNNING trial whose tuner is gone is retired before each ask and its
exact parameters are enqueued again, so a killed tuner, started again with the same arguments,
loses no trial and repeats none.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import optuna
from optuna.trial import TrialState

from ..words import count, noun
from . import config as C
from . import extensions as X
from . import trial as T
from . import evidence as E
from . import scores as SC
from .node_agent import NodeAgent, agent_env
from .objective import StepStats
from .sampler import BASELINE, REPEAT, SAMPLED, SEED, baseline_values, make_sampler, queued_trials  # noqa: F401
from .space import Space
from .storage import TuneError, open_storage, owner, retire, retire_stale, shown_url, storage_lock, storage_url  # noqa: F401

HEARTBEAT_S = 30.0


@dataclass
class Settings:
    base_config: Path
    command: str
    trials: int
    out: Path
    storage: str                        # RDB URL (sqlite:///... for a file)
    study_name: str
    space: Space = field(default_factory=Space)
    facts: C.Facts = field(default_factory=C.Facts)
    timeout_s: float = 3600.0
    grace_s: float = 10.0
    warmup: int = 3
    min_steps: int = 5
    prune: bool = True
    prune_ratio: float = 1.25           # stop a trial this much slower than the best after warm-up
    prune_min_steps: int = 5
    poll_s: float = 2.0
    max_memory_bytes: float | None = None
    instrument: bool = True
    export_interval_ms: int = 1000
    otlp_endpoint: str | None = None
    seed: int | None = None
    deepspeed_check: bool = True
    stale_after_s: float = 300.0
    prebuild_ops: tuple[str, ...] = ()      # DeepSpeed op builder names to build before the first trial
    node_agent: bool = False                # run `otel-gpu agent` beside each trial, exporting where it does
    node_agent_args: tuple[str, ...] = ()   # extra flags for that agent
    baseline_runs: int = 2                  # times the baseline runs (noise), when the budget allows
    keep_going: bool = False                # run the other trials even when every baseline run failed
    objectives: tuple[str, ...] = SC.DEFAULT    # what trials are scored by (scores.py); several: multi-objective


@dataclass
class Record:
    """One finished trial, as written to result.json and kept in the study's user attributes."""

    number: int
    trial_id: str
    role: str
    params: dict
    status: str
    reason: str
    step_time_s: float | None = None
    steady_steps: int = 0
    total_steps: int = 0
    seconds: float = 0.0
    overhead_s: float = 0.0          # tuner time around the trial: config, start, scoring
    evidence: dict = field(default_factory=dict)
    directory: str = ""


class Tuner:
    """`prepare()` then `run()`; `events(kind, payload)` hears "start" (Record-less dict) and "end" (Record)."""

    def __init__(self, settings: Settings, objective, env: Mapping[str, str] | None = None,
                 events: Callable[[str, Any], None] | None = None):
        self.s, self.objective = settings, objective
        self.env = dict(os.environ if env is None else env)
        self.events = events or (lambda kind, payload: None)
        self.records: list[Record] = []
        self.base: dict = {}
        self.space = settings.space
        self.study: optuna.Study | None = None
        self.rdb: optuna.storages.RDBStorage | None = None      # a database server's storage (for its lock)
        self.extension_roots = X.extension_roots(self.env)

    # ---- set-up -----------------------------------------------------------------------------------
    def prepare(self) -> None:
        s = self.s
        raw = C.read_config_bytes(s.base_config)   # once: it may be a pipe
        base = C.parse_config(raw, s.base_config)
        if (base.get("zero_optimization") or {}).get("stage") != 3:
            raise TuneError(f"{s.base_config}: zero_optimization.stage is not 3; this tuner tunes ZeRO stage 3")
        facts, notes = C.with_defaults(base, s.facts)
        self.base = C.resolve_auto(base, facts)
        for note in notes + C.left_auto(self.base):
            self.events("note", note)
        values = baseline_values(s.space, self.base)
        unresolved = [p.name for p in s.space.params if values.get(p.name) in (None, C.AUTO)]
        if unresolved:
            raise TuneError(f"{unresolved[0]} is tuned but {_why_missing(unresolved[0])}")
        problems = C.validate(self.base, s.facts.world_size)
        if problems:
            raise TuneError(f"{s.base_config}: the base config itself would be rejected: {problems[0]}")
        self.space = s.space.widened_to(values)
        for extra in s.space.enqueue:           # the user's own settings are tried as given
            self.space = self.space.widened_to(extra)
        self.baseline = values
        if s.deepspeed_check:                   # imports DeepSpeed once, here, not in the first trial
            errors = C.deepspeed_errors(self.base)
            if errors:
                raise TuneError(f"{s.base_config}: DeepSpeed rejects the base config: {errors[0]}")
        s.out.mkdir(parents=True, exist_ok=True)
        if s.storage.startswith("sqlite:///"):
            Path(s.storage[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        sampler = make_sampler(s.seed)
        identity = {"base_config_sha256": hashlib.sha256(raw).hexdigest(), "command": s.command}
        # a server's lock needs the storage first; SQLite's file lock is taken before it is opened
        self.rdb = None if s.storage.startswith("sqlite:///") else open_storage(s.storage)
        with storage_lock(s.storage, self.rdb):
            self.study = optuna.create_study(storage=self.rdb or open_storage(s.storage), study_name=s.study_name,
                                             directions=SC.directions(s.objectives), sampler=sampler, load_if_exists=True)
            SC.check_study(self.study, s.objectives, s.study_name)
            self._seed(identity, values)
        self.retire_stale()
        self._clean_extensions("before the first trial")
        if s.prebuild_ops:
            self.events("note", f"building DeepSpeed {noun(len(s.prebuild_ops), 'op')} {', '.join(s.prebuild_ops)} "
                                "before the first trial")
            env = T.trial_env(self.env, f"{s.study_name}-prebuild", instrument=False, export_interval_ms=None,
                              otlp_endpoint=s.otlp_endpoint)
            try:
                X.prebuild_ops(list(s.prebuild_ops), env, s.timeout_s, s.out / "prebuild.log", s.grace_s)
            except X.PrebuildError:
                self._clean_extensions("after the failed build")
                raise

    def _clean_extensions(self, when: str) -> list[Path]:
        """Remove torch extension builds a killed process left (their lock held by no process)."""
        removed = X.clean_stale(self.extension_roots)
        if removed:
            self.events("note", f"removed {count(len(removed), 'half-built torch extension')} {when}: "
                                + ", ".join(str(p) for p in removed))
        return removed

    def _stuck_on(self, pgid: int) -> str | None:
        """What a trial at its timeout waits on, where it can be seen: a torch extension lock."""
        for lock in X.find_locks(self.extension_roots):
            if lock.stale:
                return f"waiting on {lock.describe()}, left by a killed build"
            if any(T.pgid_of(pid) == pgid for pid in lock.holders):
                return (f"still building the torch extension {lock.path.parent.name} at the timeout "
                        "(a first JIT build can take minutes: raise --trial-timeout)")
            return f"waiting on {lock.describe()}: another build on this node"
        return None

    def _seed(self, identity: dict, values: dict) -> None:
        s = self.s
        attrs = self.study.user_attrs
        if "base_config_sha256" not in attrs:
            for k, v in {**identity, "resolved_base": self.base, "base_config": str(s.base_config),
                         "out": str(s.out.resolve())}.items():
                self.study.set_user_attr(k, v)
            for params, attrs in queued_trials(self.space, values, s.trials, s.baseline_runs):
                self.study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=REPEAT not in attrs)
        else:
            for k, v in identity.items():
                if attrs.get(k) != v:
                    what = "base config" if k.startswith("base") else "command"
                    raise TuneError(f"study {s.study_name!r} in {shown_url(s.storage)} was started with a different {what}; "
                                    "pass the same one to resume, or a new --study")

    # ---- resume -----------------------------------------------------------------------------------
    def retire_stale(self) -> list[int]:
        """Retire RUNNING trials whose tuner is gone; returns their numbers."""
        with storage_lock(self.s.storage, self.rdb):
            return retire_stale(self.study, self.s.stale_after_s, self.s.grace_s)

    # ---- the loop -----------------------------------------------------------------------------------
    def counted(self) -> int:
        """Finished trials that count toward --trials (interrupted ones do not), plus running ones."""
        n = 0
        for t in self.study.get_trials(deepcopy=False):
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING):
                n += 1
            elif t.state == TrialState.FAIL and t.user_attrs.get("status") != T.INTERRUPTED:
                n += 1
        return n

    def best(self) -> tuple[float, int] | None:
        """(step time, trial number) of the fastest completed trial: what pruning compares against."""
        done = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.user_attrs.get("step_time_s") is not None]
        if not done:
            return None
        t = min(done, key=lambda t: t.user_attrs["step_time_s"])
        return t.user_attrs["step_time_s"], t.number

    def run(self) -> list[Record]:
        while True:
            self.retire_stale()
            t0 = time.monotonic()
            with storage_lock(self.s.storage, self.rdb):   # count and ask as one step: exact budget
                if self.counted() >= self.s.trials:
                    return self.records
                failed = None if self.s.keep_going else self.baseline_failure()
                if failed:
                    raise BaselineFailed(failed)
                trial = self.study.ask()
            self.records.append(self.run_one(trial, t0))

    def baseline_failure(self) -> str | None:
        """Why the study cannot go on: every finished baseline run failed to be measured (crash, oom,
        hang, timeout, rejected, incomplete), in one line with the latest one's reason; else None. Every
        other trial would be measured against the baseline, and most would fail the same way. Not a
        failure here: over the memory limit (it ran and was measured), and a hang whose cause the tuner
        removed (a half-built torch extension: the next trial builds it afresh)."""
        done = [t for t in self.study.get_trials(deepcopy=False)
                if t.user_attrs.get("role") == BASELINE and t.user_attrs.get("status") not in (None, T.INTERRUPTED)]
        if not done or any(t.user_attrs.get("status") in (T.OK, T.OVER_MEMORY) or
                           "removed the half-built torch extension" in str(t.user_attrs.get("reason")) for t in done):
            return None
        last = max(done, key=lambda t: t.number)
        reason = " ".join(str(last.user_attrs.get("reason") or "no reason recorded").split())
        return (f"the baseline (trial {last.number}, your config unchanged) failed: {last.user_attrs['status']}: "
                f"{reason}; no further trial is started (fix the command or config and start a new study, e.g. "
                "with a new --out; or pass --keep-going)")

    def run_one(self, trial: optuna.Trial, t0: float) -> Record:
        """Run an asked trial (`t0`: time.monotonic() before the ask) to its record."""
        try:
            return self._run(trial, t0)
        except BaseException:
            # KeyboardInterrupt/SIGTERM, or a bug: the trial's group is already killed by run_trial
            frozen = self.study._storage.get_trial(trial._trial_id)
            if frozen.state == TrialState.RUNNING:
                retire(self.study, frozen, "the tuner was stopped during the trial", self.s.grace_s)
            raise

    def _run(self, trial: optuna.Trial, t0: float) -> Record:
        s, storage, tid = self.s, self.study._storage, trial._trial_id
        role = trial.user_attrs.get("role", SAMPLED)
        params = self.space.suggest(trial)
        trial_id = f"{s.study_name}-{trial.number}"
        directory = s.out / "trials" / f"{trial.number:04d}"
        try:
            directory.mkdir(parents=True)
        except FileExistsError:
            raise TuneError(f"{directory} exists: this --out folder holds another study's trials; use a new --out") from None
        for k, v in {**owner(), "trial_id": trial_id, "dir": str(directory), "heartbeat": time.time(),
                     "role": role}.items():
            storage.set_trial_user_attr(tid, k, v)
        cfg = C.trial_config(self.base, self.space, params, baseline=role == BASELINE, world_size=s.facts.world_size)
        config_path = C.write_json(directory / "ds_config.json", cfg, exclusive=True)
        C.write_json(directory / "params.json", {"role": role, **params}, exclusive=True)
        reasons = C.validate(cfg, s.facts.world_size)
        if not reasons and s.deepspeed_check:
            reasons = C.deepspeed_errors(cfg) or []
        record = Record(trial.number, trial_id, role, params, T.REJECTED, "; ".join(reasons), directory=str(directory))
        self.events("start", {"number": trial.number, "role": role, "params": params})
        if not reasons:
            command = T.render_command(s.command, config_path.resolve(), directory.resolve(), trial.number, trial_id)
            env = T.trial_env(self.env, trial_id, instrument=s.instrument,
                              export_interval_ms=s.export_interval_ms, otlp_endpoint=s.otlp_endpoint)
            prepare = getattr(self.objective, "prepare", None)     # a recording objective starts its recorder
            if prepare is not None:
                env = prepare(trial_id, directory, env)
            (directory / "command.txt").write_text(command + "\n")
            agent = None
            if s.node_agent:
                log_dir = directory / "recording" if (directory / "recording").is_dir() else directory
                agent = NodeAgent(agent_env(env, self.env), log_dir / E.AGENT_LOG, s.node_agent_args)
            added = {k: v for k, v in env.items() if self.env.get(k) != v}
            C.write_json(directory / "env.json", added, exclusive=True)
            record = self._launch(trial, record, command, env, directory, t0, agent)
        else:
            record.overhead_s = time.monotonic() - t0
        return self._finish(trial, record)

    def _launch(self, trial, record: Record, command: str, env: dict, directory: Path, t0: float,
                agent: NodeAgent | None = None) -> Record:
        s, storage, tid = self.s, self.study._storage, trial._trial_id
        best = self.best()
        plan = T.TrialPlan(trial.number, record.trial_id, directory, command, env, s.timeout_s, s.grace_s)
        state = {"beat": time.monotonic(), "query": time.monotonic(), "started": time.time(), "step": 0}

        def on_start(pgid: int) -> None:
            state["started"] = time.time()
            state["launch_overhead"] = time.monotonic() - t0
            # the group's start time first: a tuner killed between the two writes must never leave a
            # `pgid` without it, or a resume could not tell the group from a reused pid and would leave it running
            storage.set_trial_user_attr(tid, "pg_start", T.start_time(pgid))
            storage.set_trial_user_attr(tid, "pgid", pgid)

        def monitor() -> str | None:
            now = time.monotonic()
            if now - state["beat"] >= HEARTBEAT_S:
                state["beat"] = now
                storage.set_trial_user_attr(tid, "heartbeat", time.time())
            if (not s.prune or best is None or record.role == BASELINE or now - state["query"] < s.poll_s
                    or s.objectives != SC.DEFAULT):   # pruning is by step time: only when that is the score
                # baseline runs are never pruned: every result is measured against them, and their
                # repeats measure the noise
                return None
            state["query"] = now
            try:
                stats = self.objective.measure(record.trial_id, directory, state["started"])
            except Exception:      # a backend hiccup never stops a trial; scoring decides later
                return None
            if stats.step_time_s is None or stats.steady_steps < s.prune_min_steps:
                return None
            state["step"] = max(state["step"] + 1, stats.steady_steps)
            trial.report(stats.step_time_s, state["step"])
            if stats.step_time_s > best[0] * s.prune_ratio:
                return (f"{stats.step_time_s:.4g} s/step after {count(stats.steady_steps, 'steady step')}, "
                        f"{stats.step_time_s / best[0]:.2f}x the best ({best[0]:.4g} s, trial {best[1]})")
            return None

        def on_timeout(pgid: int) -> None:
            state["stuck_on"] = self._stuck_on(pgid)

        if agent is not None:
            agent.start()           # before the trial (and its leftover tracking) starts
        try:
            run = T.run_trial(plan, monitor, poll_s=min(1.0, s.poll_s), on_start=on_start, on_timeout=on_timeout)
        finally:
            if agent is not None:   # its last export lands before the trial's recorder closes
                agent.stop()
            close = getattr(self.objective, "close", None)      # a recording objective: stop its recorder
            if close is not None:
                close(record.trial_id)
        t_end = time.monotonic()
        cleaned = self._clean_extensions(f"after trial {trial.number}")
        record.status, record.reason, record.seconds = run.status, run.reason, run.seconds
        stats: StepStats | None = None
        try:
            if run.status == T.OK:
                stats = self.objective.final(record.trial_id, directory, run.started, run.ended, s.min_steps)
                problem = stats.problem(s.min_steps)
                if problem:
                    record.status, record.reason = T.INCOMPLETE, problem
            elif run.status in (T.PRUNED, T.TIMEOUT):
                stats = self.objective.measure(record.trial_id, directory, run.started, run.ended)
            if stats is not None:
                record.step_time_s, record.steady_steps, record.total_steps = (
                    stats.step_time_s, stats.steady_steps, stats.total_steps)
                if run.status == T.TIMEOUT and stats.total_steps:
                    record.reason += f" ({count(stats.total_steps, 'step')} done)"
                record.evidence = self.objective.evidence(stats, record.trial_id, directory) if stats.window else {}
                if not record.evidence:
                    why = f"not checked: no steady window in the metrics (scored from the {stats.source})"
                    record.evidence = {E.NOT_CHECKED: {k: why for k in (*(c[0] for c in E.COLUMNS), E.COLLECTIVES)}}
                if agent is not None and agent.problem:
                    record.evidence["node_agent"] = agent.problem
        except Exception as exc:    # the backend failed at scoring: the trial cannot be judged
            if record.status == T.OK:
                record.status = T.INCOMPLETE
            record.reason = f"{record.reason}; scoring failed: {' '.join(str(exc).split())[:200]}"
        if run.status == T.TIMEOUT and stats is not None and not stats.total_steps:
            record.status = T.HANG
            record.reason = T.startup_hang_reason(s.timeout_s, state.get("stuck_on"), run.log_tail)
        if cleaned and record.status != T.OK:
            record.reason += (f"; removed the half-built torch {noun(len(cleaned), 'extension')} it left: "
                              + ", ".join(p.name for p in cleaned))
        peak = record.evidence.get(E.MEMORY_KEY)
        if record.status == T.OK and s.max_memory_bytes and peak is not None and peak > s.max_memory_bytes:
            record.status = T.OVER_MEMORY
            record.reason = f"peak GPU memory {peak / 2**30:.2f} GiB over the {s.max_memory_bytes / 2**30:.2f} GiB limit"
        record.overhead_s = state.get("launch_overhead", 0.0) + (time.monotonic() - t_end)
        return record

    def _finish(self, trial, record: Record) -> Record:
        storage, tid = self.study._storage, trial._trial_id
        values, why = SC.values_of(self.s.objectives, record.step_time_s, record.evidence)
        if record.status == T.OK and values is None:   # an objective's input is missing: never scored 0
            record.status, record.reason = T.INCOMPLETE, why
        for k in ("status", "reason", "step_time_s", "steady_steps", "total_steps", "seconds", "overhead_s", "evidence"):
            storage.set_trial_user_attr(tid, k, getattr(record, k))
        C.write_json(Path(record.directory) / "result.json", record.__dict__, exclusive=True)
        if record.status == T.OK:
            self.study.tell(trial, values)
        else:
            self.study.tell(trial, state=TrialState.PRUNED if record.status == T.PRUNED else TrialState.FAIL)
        if record.status == T.OK:
            best = SC.front(self.study)
            if len(self.study.directions) == 1 and best and best[0].number == record.number:
                cfg = C.read_config(Path(record.directory) / "ds_config.json")
                C.write_json(self.s.out / "best_config.json", cfg)
        self.events("end", record)
        return record


class BaselineFailed(TuneError):
    """The baseline failed: the study stops before any other trial (one line, exit 1)."""


def _why_missing(name: str) -> str:
    """How to give a tuned parameter its baseline value."""
    if name in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        return ('"auto" in the base config: pass --hidden-size or --model so the baseline can be resolved '
                "the way Hugging Face does")
    if name == "train_micro_batch_size_per_gpu":
        return '"auto" or missing in the base config: pass --micro-batch, --grad-accum and --world-size'
    return "missing from the base config and its DeepSpeed default is unknown here: set it in the base config"


def default_study_name(base_config: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", base_config.stem).strip("-") or "tune"
