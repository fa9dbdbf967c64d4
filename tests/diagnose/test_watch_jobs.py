"""`diagnose --watch` and `run`'s live findings on jobs that meet a problem mid-run.

Each job (jobs/onset_train.py: 2 ranks, torchrun, gloo, no otel-gpu import) runs clean, then meets
its problem at a time it picks and records itself (the truth). It runs under `otel-gpu run --record`
while its metrics are also forwarded to VictoriaMetrics, so one run is watched on both paths at once:
`diagnose --watch RUN_DIR` (the recording being written) and `diagnose --watch --prometheus`. Each
problem must be named right (rule and rank) within 60 s of its onset on both paths and by `run`
itself, nothing above info before the onset, and nothing above info ever on a clean job.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.childenv import clean_env
from tests.servers import free_port

pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
pytestmark = pytest.mark.slow
JOB = Path(__file__).with_name("jobs") / "onset_train.py"
OTEL_GPU = [sys.executable, "-m", "otel_gpu"]
BOUND_S = 60.0          # a problem is named within this long after its onset
EVERY, LAST, HOLD = "3s", "60s", "30s"
# problem -> (rank the script puts it on, onset s after the first step, rule that must name it, ranks it names)
CASES = {
    "straggler": (1, 25.0, "straggler", ["1"]),
    "input": (0, 30.0, "input", None),
    "checkpoint": (0, 20.0, "checkpoint", ["0"]),
    "hang": (0, 25.0, "stall", ["0"]),
}
THRESHOLDS = "[stall]\nmin_s = 10\n"   # a hang is named after 10 s without a step (default 120 s)


@dataclass
class Watch:
    """A child whose stdout is JSON lines, read as they come."""
    proc: subprocess.Popen
    events: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self):
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass


@dataclass
class Outcome:
    truths: list[dict]
    paths: dict[str, list[dict]]      # "recording" / "prometheus" / "run" -> events
    run_stderr: str


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM, timeout=30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _named(events: list[dict], rule: str, ranks: list[str] | None) -> dict | None:
    return next((e for e in events if e["event"] == "appeared" and e["rule"] == rule and e["severity"] != "info"
                 and (ranks is None or e["where"].get("ranks") == ranks)), None)


def watch_job(vm, tmp: Path, problem: str, seconds: float, rule: str | None = None,
              ranks: list[str] | None = None, rank: int = 1, onset: float = 1e9) -> Outcome:
    """Run the job under `otel-gpu run` with both watchers beside it; stop once both named `rule` (or
    the job ended)."""
    job = f"watch-{problem}-{uuid.uuid4().hex[:6]}"
    run_dir, truth, th = tmp / job, tmp / f"{job}.truth", tmp / "thresholds.toml"
    th.write_text(THRESHOLDS)
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry")
    cmd = [*OTEL_GPU, "run", "--record", str(run_dir), "--job", job, "--no-profile", "--no-report", "--thresholds", str(th),
           "--agent-arg=--no-gpu", "--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), str(JOB), "--problem", problem, "--rank", str(rank),
           "--onset", str(onset), "--seconds", str(seconds), "--truth", str(truth)]
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    common = ["--json", "-", "--every", EVERY, "--last", LAST, "--hold", HOLD, "--thresholds", str(th)]
    watches = {
        "recording": [*OTEL_GPU, "diagnose", "--watch", str(run_dir), *common],
        "prometheus": [*OTEL_GPU, "diagnose", "--watch", "--prometheus", vm.url, "--job", job, *common],
    }
    logs = {name: open(tmp / f"{job}.{name}.log", "w") for name in watches}
    watches = {name: Watch(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=logs[name], text=True))
               for name, argv in watches.items()}
    deadline = time.time() + seconds + 60
    try:
        while run.poll() is None and time.time() < deadline:
            if rule and all(_named(w.events, rule, ranks) for w in watches.values()) and \
                    _named(_live(run_dir), rule, ranks):
                break
            time.sleep(1)
    finally:
        codes = {name: _stop(w.proc) for name, w in watches.items()}
        _stop(run, signal.SIGINT, timeout=60)
        for f in logs.values():
            f.close()
    stderr = run.stderr.read()
    for name in watches:   # what each watcher said about its input, for a failure's message
        stderr += f"\n[{name} watcher] " + (tmp / f"{job}.{name}.log").read_text()[-1500:]
    assert codes == {"recording": 0, "prometheus": 0}, "a watcher exits 0 on SIGTERM"
    truths = [json.loads(line) for line in truth.read_text().splitlines()] if truth.exists() else []
    return Outcome(truths, {**{k: w.events for k, w in watches.items()}, "run": _live(run_dir)}, stderr)


def _live(run_dir: Path) -> list[dict]:
    """The events `run` printed while the job ran, as it keeps them in the run folder."""
    f = run_dir / "live-events.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


@pytest.mark.parametrize("problem", list(CASES))
def test_a_problem_starting_mid_run_is_named_within_a_minute_on_every_path(victoriametrics, tmp_path, problem):
    rank, onset, rule, ranks = CASES[problem]
    out = watch_job(victoriametrics, tmp_path, problem, seconds=onset + BOUND_S + 30, rule=rule, ranks=ranks,
                    rank=rank, onset=onset)
    onsets = [t["onset_t"] for t in out.truths if "onset_t" in t]
    assert onsets, f"the job recorded no onset: {out.run_stderr[-2000:]}"
    onset_t = min(onsets)
    for path, events in out.paths.items():
        early = [e for e in events if e["severity"] != "info" and e["event"] == "appeared" and e["t"] < onset_t]
        assert not early, f"{path}: findings before the onset: {[(e['rule'], e['title']) for e in early]}"
        hit = _named(events, rule, ranks)
        assert hit is not None, (f"{path}: {rule} naming {ranks} not seen: {[(e['rule'], e['title']) for e in events]}"
                                 f"\n{out.run_stderr[-3000:]}")
        bound = BOUND_S + (20 if path == "run" else 0)   # run evaluates every 10 s over 2 min, the watchers 3 s / 1 min
        assert hit["t"] - onset_t <= bound, f"{path}: named {hit['t'] - onset_t:.0f} s after the onset"
    assert f"appeared [" in out.run_stderr and f"] {rule}:" in out.run_stderr, "run says it on stderr while it happens"


def test_a_clean_job_shows_nothing_above_info(victoriametrics, tmp_path):
    out = watch_job(victoriametrics, tmp_path, "clean", seconds=90)   # ~70 s judged, 20+ evaluations a path
    for path, events in out.paths.items():
        loud = [(e["rule"], e["severity"], e["title"]) for e in events if e["severity"] != "info"]
        assert not loud, f"{path}: {loud}"
    assert "appeared [" not in out.run_stderr.replace("appeared [info]", "")
