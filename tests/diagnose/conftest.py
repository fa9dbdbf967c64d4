"""A real Prometheus holding fixed, backfilled jobs (older than 2 h) for the diagnosis tests."""
from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass

import pytest

from tests.servers import PROMETHEUS_BIN, Prometheus, require_binary

from .backfill import OpenMetricsWriter, SyntheticJob, backfill
from .smi import CAPTURES, write_capture_job

END = math.floor(time.time() / 60) * 60 - 3 * 3600
SMI_DURATION = 1800.0


@dataclass
class Backfilled:
    prometheus: Prometheus
    synth: SyntheticJob        # checkpoints, a thermally throttled straggler, SMs idle behind utilization
    clean: SyntheticJob        # the same job without problems
    smi_job: str               # real nvidia-smi rows: three GPUs, idle stalls of 10 s every 70 s
    smi_start: float
    smi_end: float


@pytest.fixture(scope="session")
def backfilled(tmp_path_factory) -> Backfilled:
    require_binary(PROMETHEUS_BIN, "Prometheus")
    if shutil.which("promtool") is None:
        pytest.skip("promtool not found (Debian package prometheus)")
    tmp = tmp_path_factory.mktemp("diagnose-prom")
    prom = Prometheus("global:\n  scrape_interval: 15s\n", tmp)
    synth = SyntheticJob(job="synth", end=END)
    clean = SyntheticJob(job="clean", end=END, straggler=None, sm=0.65, ckpt_every=1e9)
    for job in (synth, clean):
        with OpenMetricsWriter(tmp / f"{job.job}.om") as om:
            job.write(om)
        backfill(tmp / f"{job.job}.om", prom.data_dir)
    if CAPTURES.is_dir():   # shared test material; the tests of this job skip without it (smi.needs_captures)
        with OpenMetricsWriter(tmp / "smi.om") as om:
            write_capture_job(om, "smi", ["h100", "h200", "h100-mig"], END - SMI_DURATION, SMI_DURATION)
        backfill(tmp / "smi.om", prom.data_dir)
    prom.start()
    yield Backfilled(prom, synth, clean, "smi", END - SMI_DURATION, END)
    prom.stop()
