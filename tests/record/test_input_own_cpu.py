"""The input rule judges the job's own processes' CPU, not the host's: a recorded job whose DataLoader
workers only sleep, run while other processes keep every CPU of the host busy. The node agent reads the
rank and both workers (the processes below `otel-gpu run`), the job uses a fraction of a CPU, and the
advice is more workers, as it is on an idle host (the host's CPU was judged before: "starved of CPU,
fewer workers" here)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from otel_gpu import names as N
from otel_gpu.diagnose import run_rules
from otel_gpu.diagnose.rules_train import MORE_WORKERS
from otel_gpu.record.reader import Recording
from otel_gpu.record.window import recorded_window

from .conftest import HERE, record

pytestmark = pytest.mark.slow
BURN = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass"


def test_a_busy_host_does_not_flip_the_advice_for_a_sleeping_loader(tmp_path):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(os.cpu_count() or 2)]
    try:
        run = record(tmp_path / "run", [sys.executable, str(HERE / "sleepy_loader_job.py"), "100"], "--no-live")
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    with Recording.open([run.directory]) as rec:
        pids = {s.get(N.PID) for s, _ in rec.summaries(N.PROCESS_CPU_UTILIZATION.name)}
        w = recorded_window(rec)
    assert len(pids) >= 3, pids                      # the rank and its two DataLoader workers
    (node,) = w.nodes
    assert node.cpu_busy >= 0.85, node               # the host is busy: the other processes'
    assert node.job_cpu is not None and node.cpus and node.job_cpu / node.cpus < 0.5, node
    (f,) = [x for x in run_rules(w) if x.rule == "input" and not x.missing]
    print(f"job {node.job_cpu:.2f} of {node.cpus:.0f} CPUs, host {node.cpu_busy:.1%} busy, data wait {f.lost_share:.1%}")
    assert f.action == MORE_WORKERS and "starved" not in f.action, f.seen
    assert "the rest other processes'" in f.seen and f"of {node.cpus:.0f} CPUs" in f.seen, f.seen
