"""GC time and the CUDA allocator's counters, exported per rank: the allocator read through a stand-in for
`torch.cuda` that replays recorded real `memory_stats()` answers (tests/data/cuda_memory_stats), the GC
clock on this interpreter's real collector."""
from __future__ import annotations

import gc
import json
from pathlib import Path

from hypothesis import given, strategies as st
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu import names
from otel_gpu.training.allocator import KEYS, AllocatorReader, AllocatorStats, cuda_of_process, parse
from otel_gpu.training.gc_clock import GcClock
from otel_gpu.training.session import Session
from tests.training.test_session import _points

DATA = Path(__file__).parents[1] / "data" / "cuda_memory_stats"
OOM = json.loads((DATA / "oom_retries_v100.json").read_text())


class RecordedCuda:
    """`torch.cuda` at the boundary: `is_initialized`, `device_count`, `memory_stats(device)` answer from
    recorded outputs; counts the calls."""

    def __init__(self, per_device: list[dict], initialized: bool = True):
        self.per_device, self.initialized, self.calls = per_device, initialized, 0

    def is_initialized(self):
        return self.initialized

    def device_count(self):
        return len(self.per_device)

    def memory_stats(self, device):
        self.calls += 1
        if not self.initialized:
            raise AssertionError("memory_stats read before CUDA was initialised")
        return self.per_device[device]


def test_parse_reads_the_recorded_answer():
    s = parse(OOM)
    assert s == AllocatorStats(reserved=50331648, allocated=42817536, inactive_split=None, retries=33, ooms=2)
    assert parse(json.loads((DATA / "not_initialized.json").read_text())) is None


@given(st.dictionaries(st.sampled_from([*KEYS.values(), "reserved_bytes.all.peak", "other"]),
                       st.one_of(st.integers(-5, 2**62), st.floats(allow_nan=True), st.booleans(), st.none(), st.text(max_size=3))))
def test_parse_never_raises_and_keeps_only_counts(stats):
    s = parse(stats)
    if s is not None:
        for v in (s.reserved, s.allocated, s.inactive_split, s.retries, s.ooms):
            assert v is None or (isinstance(v, int) and v >= 0)


def test_reader_skips_unused_devices_and_never_reads_before_init():
    unused = {k: 0 for k in KEYS.values()}
    cuda = RecordedCuda([unused, OOM])
    assert set(AllocatorReader(cuda).read()) == {"1"}
    cold = RecordedCuda([OOM], initialized=False)
    assert AllocatorReader(cold).read() == {} and cold.calls == 0


def test_reader_fails_once_and_stays_quiet():
    class Broken(RecordedCuda):
        def memory_stats(self, device):
            self.calls += 1
            raise RuntimeError("driver went away")
    cuda = Broken([OOM])
    reader = AllocatorReader(cuda)
    assert reader.read() == {} and reader.read() == {} and cuda.calls == 1


def test_process_without_cuda_reads_nothing():
    # torch 2.13 CPU here: imported, CUDA never initialised -> nothing read, no context made
    import torch
    assert cuda_of_process() is None and not torch.cuda.is_initialized()


def test_session_exports_allocator_and_gc_per_rank():
    reader = InMemoryMetricReader()
    session = Session({"RANK": "1", "WORLD_SIZE": "2", "OTELGPU_JOB": "unit"}, readers=[reader], profile=False, host="h")
    cuda = RecordedCuda([OOM])
    session.sink.allocator = AllocatorReader(cuda)
    try:
        with session.timer.step(samples=1):
            pass
        gc.collect(2)
        with session.timer.step(samples=1):
            gc.collect(2)
        points, _ = _points(reader)
    finally:
        session.shutdown()
    assert cuda.calls == 1   # five instruments, one read
    by = {name: {p.attributes.get(names.CUDA_DEVICE): p.value for p in points[name]}
          for name in (names.TRAIN_ALLOC_RESERVED.name, names.TRAIN_ALLOC_ALLOCATED.name,
                       names.TRAIN_ALLOC_RETRIES.name, names.TRAIN_ALLOC_OOMS.name)}
    assert by == {names.TRAIN_ALLOC_RESERVED.name: {"0": 50331648}, names.TRAIN_ALLOC_ALLOCATED.name: {"0": 42817536},
                  names.TRAIN_ALLOC_RETRIES.name: {"0": 33}, names.TRAIN_ALLOC_OOMS.name: {"0": 2}}
    assert names.TRAIN_ALLOC_INACTIVE_SPLIT.name not in points   # not in the recorded answer: not exported
    assert points[names.TRAIN_ALLOC_RETRIES.name][0].attributes[names.RANK] == "1"
    gen = {p.attributes[names.GC_GENERATION]: p.value for p in points[names.TRAIN_GC_COLLECTIONS.name]}
    assert gen["2"] >= 2   # the two full collections after the first step (set-up's are left out)
    secs = {p.attributes[names.GC_GENERATION]: p.value for p in points[names.TRAIN_GC_TIME.name]}
    assert secs["2"] > 0 and set(secs) == {"0", "1", "2"}
    assert session.gc_clock.callback not in gc.callbacks   # shut down: no longer called


def test_gc_clock_times_full_collections():
    clock = GcClock()
    keep = [[i] for i in range(200_000)]   # a heap the full collection has to walk
    clock.install()
    try:
        for _ in range(3):
            gc.collect(2)
    finally:
        clock.uninstall()
    assert clock.collections()["2"] == 3
    # each full collection walks the 200k lists: well above the clock's own resolution
    assert clock.seconds()["2"] > 3 * 1e-5
    del keep
    gc.collect(2)
    assert clock.collections()["2"] == 3   # uninstalled: not counted
