"""A recording with 20 s of start-up before the first step (GPUs idle, memory empty, clocks free),
then training on two GPUs, one held back by a thermal slowdown, memory near full and tensor pipes
mostly idle: the recorded window's GPU numbers are over training time, and the memory, throttle and
tensor rules fire on it with those numbers as evidence."""
from __future__ import annotations

import pytest

from otel_gpu import names as N
from otel_gpu.diagnose import run_rules
from otel_gpu.record.decode import Point
from otel_gpu.record.reader import Recording
from otel_gpu.record.store import Writer
from otel_gpu.record.window import recorded_window

T0 = 1_700_000_000.0
STARTUP, END = 20, 60        # seconds: the first step, the end of the run
LIMIT = 80e9


def _write(directory) -> None:
    job = "counters"
    res = (("host.name", "n0"), ("otelgpu.job", job))
    w = Writer(directory, {"job": job, "host": "n0", "started": repr(T0), "ended": repr(T0 + END + 0.5),
                           "exit_status": "0", "command": '["python", "train.py"]'})
    for i in range(1, END + 1):
        t, training = T0 + i, i > STARTUP
        pts = []
        for r in range(2):
            a = (("host.name", "n0"), ("otelgpu.job", job), ("otelgpu.rank", str(r)))
            if training:   # 10 steps of 0.1 s a second from the first step on
                n = 10 * (i - STARTUP)
                pts += [Point(N.TRAIN_STEPS.name, "counter", "{step}", "cumulative", res, a, t, n),
                        Point(N.TRAIN_STEP_DURATION.name, "histogram", "s", "cumulative", res, a, t, 0.1 * n, n,
                              (0, n), (1.0,)),
                        Point(N.TRAIN_PHASE_TIME.name, "counter", "s", "cumulative", res, a + ((N.PHASE, "forward"),),
                              t, 0.09 * n)]
        for g in range(2):
            a = (("host.name", "n0"), ("hw.id", f"GPU-{g}"), ("otelgpu.gpu.index", str(g)))
            gauge = lambda spec, v, extra=(): Point(spec.name, "gauge", spec.unit, "", res, a + extra, t, v)  # noqa: E731
            hot = g == 0 and training
            pts += [gauge(N.GPU_UTILIZATION, 0.95 if training else 0.05),
                    gauge(N.GPU_SM_ACTIVITY, 0.86 if training else 0.01),
                    gauge(N.GPU_TENSOR_ACTIVITY, 0.12 if training else 0.0),
                    gauge(N.GPU_DRAM_ACTIVITY, 0.3 if training else 0.0),
                    gauge(N.GPU_SM_OCCUPANCY, 0.4 if training else 0.0),
                    gauge(N.GPU_CLOCK, 1.6e9 if hot else 1.98e9, ((N.CLOCK_DOMAIN, "sm"),)),
                    gauge(N.GPU_CLOCK_EVENT, 1.0 if hot else 0.0, ((N.CLOCK_REASON, "hw_thermal_slowdown"),)),
                    gauge(N.GPU_TEMPERATURE, 88.0 if hot else 60.0),
                    Point(N.GPU_MEMORY_USAGE.name, "updowncounter", "By", "cumulative", res, a, t,
                          (0.97 if training else 0.01) * LIMIT),
                    Point(N.GPU_MEMORY_LIMIT.name, "updowncounter", "By", "cumulative", res, a, t, LIMIT)]
        w.add_points(pts)
    w.close()


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    d = tmp_path_factory.mktemp("counters")
    _write(d)
    with Recording.open([d]) as rec:
        return recorded_window(rec, with_profile=False)


def test_gpu_numbers_are_over_training_time(window):
    w = window
    assert w.train_start == pytest.approx(T0 + STARTUP, abs=1.0) and w.train_end == T0 + END
    assert [g.name for g in w.gpus] == ["n0/gpu0", "n0/gpu1"]
    for g in w.gpus:   # over the whole run utilization would be about 0.65
        assert g.util == pytest.approx(0.95) and g.sm == pytest.approx(0.86)
        assert (g.tensor, g.dram, g.occupancy) == pytest.approx((0.12, 0.3, 0.4))
    assert w.gpus[0].throttle["hw_thermal_slowdown"] == pytest.approx(1.0)   # 2/3 over the whole run
    assert w.gpus[0].clock_hz == pytest.approx(1.6e9)


def test_memory_throttle_and_tensor_rules_fire_with_their_evidence(window):
    found = {f.rule: f for f in run_rules(window)}
    mem = found["memory"]
    assert "97.0%" in mem.title and mem.evidence == {"n0/gpu0": 0.97, "n0/gpu1": 0.97, "allocator": "not checked"}
    assert "expandable_segments" not in mem.action   # no allocator series in this run: no allocator advice
    th = found["throttle"]
    assert "thermal" in th.title and th.where["gpus"] == ["n0/gpu0"]
    assert th.evidence["active_share_max"] == pytest.approx(1.0)
    assert "1600 MHz (reference 1980 MHz)" in th.seen and "100.0% of the training time" in th.seen
    tensor = found["tensor"]
    assert tensor.severity == "info" and tensor.evidence["tensor_activity"] == pytest.approx(0.12)
    assert "utilization 95.0%" in tensor.seen and "SM activity 86.0%" in tensor.seen
    assert "sm_idle" not in found   # 86% SM activity behind 95% utilization: nothing to say
