"""Session parts in-process: rank identity, instruments and buckets, the fork guard."""
import os

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExporter, MetricExportResult

from otel_gpu import names
from otel_gpu.identity import resource_attributes
from otel_gpu.training.session import ForkGuard, Session, rank_attributes


def test_rank_identity_from_slurm_and_defaults():
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_NAME": "llama"}
    attrs = rank_attributes(env, resource_attributes(env, host="n1"))
    assert attrs == {"host.name": "n1", "otelgpu.job": "llama", "otelgpu.rank": "5",
                     "otelgpu.local_rank": "1", "otelgpu.world_size": "8"}
    bare = rank_attributes({}, resource_attributes({}, host="n2"))
    assert bare == {"host.name": "n2", "otelgpu.rank": "0", "otelgpu.local_rank": "0", "otelgpu.world_size": "1"}
    torchrun = {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "run7"}
    assert rank_attributes(torchrun, resource_attributes(torchrun, host="n"))["otelgpu.job"] == "run7"


def _points(reader):
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = list(m.data.data_points)
    return out, rm.resource.attributes


def test_instruments_hold_totals_and_the_histogram_has_second_buckets():
    reader = InMemoryMetricReader()
    env = {"RANK": "1", "WORLD_SIZE": "2", "OTELGPU_JOB": "unit"}
    session = Session(env, readers=[reader], profile=False, host="h1")
    t = session.timer
    for _ in range(3):
        with t.step(samples=4, tokens=40):
            with t.phase("forward"):
                pass
    with t.phase("checkpoint"):
        pass
    points, resource = _points(reader)
    assert resource["host.name"] == "h1" and resource["service.instance.id"]
    (hist,) = points[names.TRAIN_STEP_DURATION.name]
    assert hist.count == 3 and tuple(hist.explicit_bounds) == names.STEP_BUCKETS
    assert hist.attributes["otelgpu.rank"] == "1" and hist.attributes["otelgpu.job"] == "unit"
    assert points[names.TRAIN_STEPS.name][0].value == 3
    assert points[names.TRAIN_SAMPLES.name][0].value == 12
    assert points[names.TRAIN_TOKENS.name][0].value == 120
    assert {p.attributes["otelgpu.phase"] for p in points[names.TRAIN_PHASE_TIME.name]} == {"forward", "checkpoint"}
    assert {p.attributes["otelgpu.checkpoint.event"]: p.value for p in points[names.TRAIN_CHECKPOINTS.name]} == \
        {"start": 1, "end": 1}
    # a second collection sees the same cumulative totals, and no step twice
    points, _ = _points(reader)
    assert points[names.TRAIN_STEP_DURATION.name][0].count == 3
    session.shutdown()


class Recording(MetricExporter):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        self.calls += 1
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        return None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_guard_drops_exports_of_a_forked_child():
    inner = Recording()
    guard = ForkGuard(inner)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: a DataLoader worker that inherited the reader
        guard.export(None)
        os.write(write, str(inner.calls).encode())
        os._exit(0)
    os.close(write)
    child_calls = os.read(read, 16).decode()
    os.waitpid(pid, 0)
    guard.export(None)
    assert (child_calls, inner.calls) == ("0", 1)
