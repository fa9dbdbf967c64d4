"""One real recorded 2-rank run (torchrun, gloo, CPU, an untouched DDP script, fake GPUs in the
node agent), shared by the tests that read it."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.childenv import clean_env
from tests.servers import free_port

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RUN = [sys.executable, "-m", "otel_gpu", "run"]


@dataclass
class RecordedRun:
    directory: Path
    proc: subprocess.CompletedProcess
    command_exit: float      # when the training command exited (unix s)
    run_exit: float          # when `otel-gpu run` exited


def torchrun(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
            str(script), *args]


def record(directory: Path, command: list[str], *run_args: str, env: dict | None = None, cwd: Path | None = None,
           timeout: float = 240) -> RecordedRun:
    """`otel-gpu run --record DIR RUN_ARGS -- COMMAND`, noting when the command and run exited."""
    stamp = directory.parent / f"{directory.name}.command-exit"
    wrapped = ["sh", "-c", '"$@"; s=$?; date +%s.%N > "$0"; exit $s', str(stamp), *command]
    proc = subprocess.run(RUN + ["--record", str(directory), *run_args, "--", *wrapped], env=env or clean_env(),
                          cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout)
    run_exit = time.time()
    return RecordedRun(directory, proc, float(stamp.read_text()) if stamp.exists() else float("nan"), run_exit)


def diagnosed_both_ways(vm, directory: Path, job: str):
    """A finished recorded run diagnosed from its recording and, over the same window, from what it
    forwarded to VictoriaMetrics `vm`: (recorded report, served report)."""
    from otel_gpu.diagnose import diagnose
    from otel_gpu.promql import PromClient
    from otel_gpu.record.diagnose import diagnose_recording

    recorded = diagnose_recording([directory])
    vm.flush()
    time.sleep(1.0)
    vm.flush()
    with PromClient(vm.url) as client:
        served = diagnose(client, job, recorded.window.start, recorded.window.end)
    return recorded, served


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory) -> RecordedRun:
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    d = tmp_path_factory.mktemp("recorded") / "ddp"
    return record(d, torchrun(HERE / "ddp_untouched.py", "250", "0"), "--agent-arg=--fake-gpus=2")


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium not installed (apt-get install -y chromium; .ci/install.sh does it)")
    return path
