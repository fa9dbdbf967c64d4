"""The NCCL part of a hang's attribution on a real GPU (world size 1 is enough for the fields): the Flight
Recorder records carry the sequence number, state and process group the stall rule reads; a collective
queued behind a busy stream is not "started" (a rank whose GPU is stuck is behind in started number);
the session exports started = completed = the collectives run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.childenv import clean_env
from tests.servers import free_port

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
JOB = Path(__file__).with_name("seq_job.py")
STEPS = 20


@pytest.mark.gpu
def test_nccl_sequence_numbers_started_and_completed_per_group():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (this torch build or machine has none)")
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                    OTELGPU_PROFILE="0")
    p = subprocess.run([sys.executable, "-c", "from otel_gpu.training import auto; auto.install(); "
                        f"import runpy; runpy.run_path({str(JOB)!r}, run_name='__main__')", str(STEPS)],
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    print(json.dumps(out))
    assert {"record_id", "collective_seq_id", "state", "process_group", "is_p2p"} <= set(out["fields"])
    group = out["queued_entry"]["process_group"][1]
    n = out["after_steps"][f"{group}|started"]
    assert n >= STEPS and out["after_steps"][f"{group}|completed"] == n
    assert out["queued_entry"]["collective_seq_id"] == n + 1 and out["queued_entry"]["state"] == "scheduled"
    assert out["while_queued"] == out["after_steps"]            # queued is neither started nor completed
    assert out["final"] == {f"{group}|started": n + 1, f"{group}|completed": n + 1}
