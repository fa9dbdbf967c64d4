"""Fixed series for diagnosis tests and the benchmark: OpenMetrics text backfilled with promtool.

`OpenMetricsWriter` streams families of timestamped samples; `backfill` turns the file into TSDB
blocks (`promtool tsdb create-blocks-from openmetrics`) in a Prometheus data directory before
the server starts. `SyntheticJob` writes a training job's series as the agent and the training
ranks export them (OTLP-translated names), with problems injected at known places, and returns
the truth to check the findings against.
"""
from __future__ import annotations

import math
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

PROMTOOL = "promtool"


class OpenMetricsWriter:
    """`family(name, kind)` then `series(sample_name, labels, times, values)` ...; `close()` ends the file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fh = open(self.path, "w")
        self._families: set[str] = set()
        self.samples = 0

    def family(self, name: str, kind: str) -> None:
        if name in self._families:
            raise ValueError(f"family {name} written twice (promtool needs each family in one block)")
        self._families.add(name)
        self._fh.write(f"# TYPE {name} {kind}\n")

    def series(self, sample: str, labels: dict[str, str], times: Sequence[float], values: Sequence[float]) -> None:
        lbl = ",".join(f'{k}="{v}"' for k, v in labels.items())
        prefix = f"{sample}{{{lbl}}} "
        self._fh.write("\n".join(f"{prefix}{v:.6g} {t:.3f}" for t, v in zip(times, values)))
        self._fh.write("\n")
        self.samples += len(times)

    def close(self) -> None:
        self._fh.write("# EOF\n")
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def backfill(om_path: str | Path, data_dir: str | Path, promtool: str = PROMTOOL) -> float:
    """Create TSDB blocks from `om_path` in `data_dir`; seconds taken. RuntimeError with promtool's output."""
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om_path), str(data_dir)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"promtool failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    return time.perf_counter() - t0


def cumulative(rates: Sequence[float], dt: float) -> list[float]:
    """Counter values from per-interval rates (the value at each point counts the interval before it)."""
    out, acc = [], 0.0
    for r in rates:
        acc += r * dt
        out.append(acc)
    return out


@dataclass
class SyntheticJob:
    """A data-parallel job: `nodes` x `gpus_per_node` ranks, one per GPU, sampled every `interval` s.

    Injected: checkpoints every `ckpt_every` s lasting `ckpt_s` (no steps, GPUs idle, disk writes);
    rank `straggler` `straggler_extra` s late in forward every step (the others wait for it in their
    backward all-reduce, on top of the `comm_s` every rank waits there),
    its GPU thermally throttled at `throttled_clock_hz`; SM activity `sm` behind utilization `util`.
    """
    job: str = "synthetic"
    nodes: int = 2
    gpus_per_node: int = 4
    duration: float = 3600.0
    interval: float = 5.0
    end: float = field(default_factory=lambda: math.floor(time.time() / 60) * 60 - 3 * 3600)
    ckpt_every: float = 600.0
    ckpt_s: float = 40.0
    step_phases: tuple[tuple[str, float], ...] = (("data_wait", 0.04), ("forward", 0.30), ("backward", 0.50),
                                                  ("optimizer", 0.16))
    straggler: int | None = 5
    straggler_extra: float = 0.25
    comm_s: float = 0.05          # seconds every rank waits in all-reduce per step (inside backward's 0.50 s)
    util: float = 0.97
    sm: float = 0.30
    clock_hz: float = 1.98e9
    throttled_clock_hz: float = 1.5e9

    @property
    def start(self) -> float:
        return self.end - self.duration

    def times(self) -> list[float]:
        n = int(self.duration / self.interval)
        return [self.start + (k + 1) * self.interval for k in range(n)]

    def host(self, node: int) -> str:
        return f"node-{node:02d}"

    def in_ckpt(self, t: float) -> float:
        """Share of the interval ending at `t` spent checkpointing (saves start at multiples of ckpt_every)."""
        a, b = t - self.interval - self.start, t - self.start
        k0, k1 = int(a // self.ckpt_every), int(b // self.ckpt_every)
        inside = 0.0
        for k in range(max(k0, 1), k1 + 1):
            s, e = k * self.ckpt_every, k * self.ckpt_every + self.ckpt_s
            inside += max(0.0, min(b, e) - max(a, s))
        return inside / self.interval

    def truth(self) -> dict:
        ts = self.times()
        ckpt = sum(self.in_ckpt(t) for t in ts) * self.interval
        step = sum(v for _, v in self.step_phases) + (self.straggler_extra if self.straggler is not None else 0)
        train_s = len(ts) * self.interval - ckpt
        return {"checkpoint_share": ckpt / (len(ts) * self.interval), "checkpoint_s": ckpt, "step_s": step,
                "steps": train_s / step, "straggler": self.straggler,
                "straggler_host": self.host(self.straggler // self.gpus_per_node) if self.straggler is not None else None,
                "period_s": self.ckpt_every, "sm_ratio": self.sm / self.util}

    def write(self, om: OpenMetricsWriter) -> None:
        ts = self.times()
        busy = [1.0 - self.in_ckpt(t) for t in ts]
        ranks = [(n, g, n * self.gpus_per_node + g) for n in range(self.nodes) for g in range(self.gpus_per_node)]
        base = {"otelgpu_job": self.job}
        slow = self.straggler
        limit_ts = ts[::12]

        def gpu_labels(n, g):
            return {**base, "host_name": self.host(n), "hw_id": f"GPU-{n:04d}-{g:04d}", "otelgpu_gpu_index": str(g)}

        def gauge(name, value_of):
            om.family(name, "gauge")
            for n, g, r in ranks:
                om.series(name, gpu_labels(n, g), ts, [value_of(r, b, k) for k, b in enumerate(busy)])

        wobble = [0.01 * math.sin(k / 7.0) for k in range(len(ts))]
        gauge("hw_gpu_utilization_ratio", lambda r, b, k: max(0.0, self.util * b + 0.02 * (1 - b) + wobble[k]))
        gauge("otelgpu_gpu_sm_activity_ratio", lambda r, b, k: max(0.0, self.sm * b + 0.01 * (1 - b) + wobble[k] / 2))
        gauge("hw_power_watts", lambda r, b, k: 80 + 540 * b)
        gauge("hw_temperature_celsius", lambda r, b, k: (88.0 if r == slow else 64.0) - 20 * (1 - b))
        om.family("otelgpu_gpu_clock_hertz", "gauge")
        for n, g, r in ranks:
            hz = self.throttled_clock_hz if r == slow else self.clock_hz
            om.series("otelgpu_gpu_clock_hertz", {**gpu_labels(n, g), "otelgpu_clock_domain": "sm"}, ts,
                      [hz * b + 345e6 * (1 - b) for b in busy])
        om.family("otelgpu_gpu_clock_event_active", "gauge")
        for n, g, r in ranks:
            for reason in ("sw_power_cap", "hw_thermal_slowdown"):
                on = 1.0 if (r == slow and reason == "hw_thermal_slowdown") else 0.0
                om.series("otelgpu_gpu_clock_event_active",
                          {**gpu_labels(n, g), "otelgpu_clock_event_reason": reason}, ts, [on * b for b in busy])
        gauge("hw_gpu_memory_usage_bytes", lambda r, b, k: 60e9)
        for name, value in (("hw_gpu_memory_limit_bytes", 80e9), ("hw_power_limit_watts", 700.0)):
            om.family(name, "gauge")
            for n, g, r in ranks:
                om.series(name, gpu_labels(n, g), limit_ts, [value] * len(limit_ts))
        om.family("otelgpu_gpu_process_memory_usage_bytes", "gauge")
        for n, g, r in ranks:
            om.series("otelgpu_gpu_process_memory_usage_bytes",
                      {**gpu_labels(n, g), "process_pid": str(1000 + r), "otelgpu_rank": str(r)}, limit_ts,
                      [50e9] * len(limit_ts))
        self._write_training(om, ts, busy, ranks, base)
        self._write_nodes(om, ts, busy, base)

    def _write_training(self, om, ts, busy, ranks, base) -> None:
        dt, slow = self.interval, self.straggler
        extra = self.straggler_extra if slow is not None else 0.0
        step_s = sum(v for _, v in self.step_phases) + extra

        def rank_labels(n, r):
            return {**base, "host_name": self.host(n), "otelgpu_rank": str(r), "otelgpu_local_rank": str(r % self.gpus_per_node),
                    "otelgpu_world_size": str(len(ranks))}

        step_rate = [b / step_s for b in busy]
        om.family("otelgpu_train_steps", "counter")
        for n, g, r in ranks:
            om.series("otelgpu_train_steps_total", rank_labels(n, r), ts, cumulative(step_rate, dt))
        om.family("otelgpu_train_step_duration_seconds", "histogram")
        for n, g, r in ranks:
            om.series("otelgpu_train_step_duration_seconds_count", rank_labels(n, r), ts, cumulative(step_rate, dt))
            om.series("otelgpu_train_step_duration_seconds_sum", rank_labels(n, r), ts, cumulative(busy, dt))
        om.family("otelgpu_train_collective_time_seconds", "counter")
        for n, g, r in ranks:
            per_step = self.comm_s + (extra if r != slow else 0.0)
            om.series("otelgpu_train_collective_time_seconds_total",
                      {**rank_labels(n, r), "otelgpu_collective": "all_reduce", "otelgpu_phase": "backward"}, ts,
                      cumulative([x * per_step for x in step_rate], dt))
        om.family("otelgpu_train_phase_time_seconds", "counter")
        for n, g, r in ranks:
            for phase, secs in self.step_phases:
                # a phase's own time: the all-reduce waits inside backward are collective time, not backward's
                per_step = secs + (extra if phase == "forward" and r == slow else 0) - (self.comm_s if phase == "backward" else 0)
                om.series("otelgpu_train_phase_time_seconds_total", {**rank_labels(n, r), "otelgpu_phase": phase}, ts,
                          cumulative([x * per_step for x in step_rate], dt))
            om.series("otelgpu_train_phase_time_seconds_total", {**rank_labels(n, r), "otelgpu_phase": "checkpoint"}, ts,
                      cumulative([1 - b for b in busy], dt))

    def _write_nodes(self, om, ts, busy, base) -> None:
        dt = self.interval
        hosts = [{**base, "host_name": self.host(n)} for n in range(self.nodes)]
        om.family("system_cpu_utilization_ratio", "gauge")
        for h in hosts:
            om.series("system_cpu_utilization_ratio", {**h, "cpu_mode": "idle"}, ts, [0.55 + 0.3 * (1 - b) for b in busy])
        om.family("system_disk_io_bytes", "counter")
        for h in hosts:
            om.series("system_disk_io_bytes_total", {**h, "system_device": "nvme0n1", "disk_io_direction": "write"}, ts,
                      cumulative([2e6 + 1.5e9 * (1 - b) for b in busy], dt))
        om.family("hw_network_io_bytes", "counter")
        for h in hosts:
            for d in ("transmit", "receive"):
                om.series("hw_network_io_bytes_total", {**h, "hw_id": "mlx5_0/1", "otelgpu_ib_device": "mlx5_0",
                                                        "otelgpu_ib_port": "1", "network_io_direction": d}, ts,
                          cumulative([6e9 * b for b in busy], dt))
        om.family("hw_network_bandwidth_limit_bytes_per_second", "gauge")
        for h in hosts:
            om.series("hw_network_bandwidth_limit_bytes_per_second", {**h, "hw_id": "mlx5_0/1", "otelgpu_ib_device": "mlx5_0",
                                                                      "otelgpu_ib_port": "1"}, ts[::12], [25e9] * len(ts[::12]))
        om.family("otelgpu_ib_errors", "counter")
        for i, h in enumerate(hosts):
            errs = 3.0 / 3600 if self.straggler is not None and i == self.straggler // self.gpus_per_node else 0.0
            om.series("otelgpu_ib_errors_total", {**h, "hw_id": "mlx5_0/1", "otelgpu_ib_device": "mlx5_0",
                                                  "otelgpu_ib_port": "1", "error_type": "symbol_error"}, ts,
                      [math.floor(v) for v in cumulative([errs] * len(ts), dt)])
        om.family("system_paging_usage_bytes", "gauge")
        for h in hosts:
            om.series("system_paging_usage_bytes", {**h, "system_paging_state": "used"}, ts[::12], [0.0] * len(ts[::12]))
