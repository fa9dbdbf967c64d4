"""Small recordings written through the real store, for tests that need exact, known content."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from otel_gpu import names as N
from otel_gpu.record.decode import Point, ProfileRows
from otel_gpu.record.store import Writer


def write_node(directory: Path, host: str, ranks: list[int], gpus: int, t0: float, seconds: int,
               step_s: float = 0.1, data_wait_share: float = 0.0, job: str = "multi",
               profiles: Sequence[ProfileRows] = ()) -> None:
    """One node's recording: `ranks` stepping every `step_s`, `gpus` GPUs, a host's CPU, one NIC, one
    disk; exports every second for `seconds`; one profile per rank every 2 s (main, train, step);
    then `profiles`."""
    res = (("host.name", host), ("otelgpu.job", job))
    w = Writer(directory, {"job": job, "host": host, "started": repr(t0), "ended": repr(t0 + seconds + 0.5),
                           "exit_status": "0", "command": '["python", "train.py"]'})
    for i in range(1, seconds + 1):
        t = t0 + i
        pts = []
        for r in ranks:
            a = (("host.name", host), ("otelgpu.job", job), ("otelgpu.rank", str(r)), ("otelgpu.world_size", "4"))
            n = round(i / step_s)
            pts += [Point(N.TRAIN_STEPS.name, "counter", "{step}", "cumulative", res, a, t, n),
                    Point(N.TRAIN_STEP_DURATION.name, "histogram", "s", "cumulative", res, a, t, n * step_s, n,
                          (0, n), (1.0,)),
                    Point(N.TRAIN_PHASE_TIME.name, "counter", "s", "cumulative", res, a + ((N.PHASE, "forward"),), t, 0.5 * i),
                    Point(N.TRAIN_PHASE_TIME.name, "counter", "s", "cumulative", res,
                          a + ((N.PHASE, "data_wait"),), t, data_wait_share * i)]
        for g in range(gpus):
            a = (("host.name", host), ("hw.id", f"GPU-{host}-{g}"), ("otelgpu.gpu.index", str(g)))
            pts += [Point(N.GPU_UTILIZATION.name, "gauge", "1", "", res, a, t, 0.9),
                    Point(N.GPU_SM_ACTIVITY.name, "gauge", "1", "", res, a, t, 0.3),
                    Point(N.GPU_MEMORY_USAGE.name, "updowncounter", "By", "cumulative", res, a, t, 4e10),
                    Point(N.GPU_MEMORY_LIMIT.name, "updowncounter", "By", "cumulative", res, a, t, 8e10)]
        h = (("host.name", host),)
        pts += [Point(N.CPU_UTILIZATION.name, "gauge", "1", "", res, h + ((N.CPU_MODE, "idle"),), t, 0.6),
                Point(N.MEMORY_UTILIZATION.name, "gauge", "1", "", res, h, t, 0.4),
                Point(N.NET_IO.name, "counter", "By", "cumulative", res, h + ((N.IFACE, "eth0"), (N.DIRECTION, "receive")), t, 1e6 * i),
                Point(N.DISK_IO.name, "counter", "By", "cumulative", res, h + ((N.DEVICE, "nvme0n1"), (N.DISK_DIRECTION, "write")), t, 2e6 * i)]
        w.add_points(pts)
        if i % 2 == 0:
            w.add_profiles([ProfileRows({"rank": str(r), "node": host, "job": job}, t - 2, t, "wall", "nanoseconds", 20_000_000,
                                        [(("<module>", "main", "train", "step"), (("phase", "forward"),), 1_000_000_000),
                                         (("<module>", "main", "load"), (("phase", "data_wait"),), 500_000_000)])
                            for r in ranks])
    if profiles:
        w.add_profiles(profiles)
    w.close()
