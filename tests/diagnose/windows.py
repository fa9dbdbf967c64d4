"""Hand-built diagnosis windows for the pure rule tests (no server)."""
from __future__ import annotations

from otel_gpu.names import OUTSIDE_STEPS
from otel_gpu.diagnose.model import GpuStats, NodeStats, RankStats, Timeline, Window

T0 = 1_700_000_000.0


def rank(r: int, host: str = "n0", steps: float = 100, step_s: float = 1.0, wall: float = 120.0,
         waits: dict[str, float] | None = None, **phases: float) -> RankStats:
    """A rank with `steps` steps of `step_s` seconds over `wall` seconds, phase seconds as given, and
    `waits` seconds blocked in collectives per phase ('' outside phases; None: not measured). As both diagnosis
    paths build them: the total and its kinds leave eval's waits out (never step time)."""
    stepped = sum(v for p, v in (waits or {}).items() if p not in OUTSIDE_STEPS)
    return RankStats(rank=str(r), host=host, steps=steps, step_time_s=steps * step_s, step_count=steps,
                     phases=dict(phases), samples=int(wall / 5) + 1, first_t=T0 + 5, last_t=T0 + wall,
                     collective_s=stepped if waits is not None else None,
                     collective_by_phase=dict(waits or {}),
                     collective_by_kind={"all_reduce": stepped} if stepped else {})


def gpu(i: int, host: str = "n0", util: float | None = 0.9, sm: float | None = 0.6, **kw) -> GpuStats:
    base = dict(power_w=500.0, power_limit_w=700.0, temp_c=60.0, temp_max_c=65.0, clock_hz=1.98e9,
                clock_max_hz=1.98e9, mem_used_b=40e9, mem_limit_b=80e9,
                throttle={"sw_power_cap": 0.0, "hw_thermal_slowdown": 0.0}, ranks=[str(i)], samples=25,
                first_t=T0 + 5, last_t=T0 + 120)
    base.update(kw)
    return GpuStats(host=host, gpu=str(i), uuid=f"GPU-{host}-{i}", util=util, sm=sm, **base)


def window(ranks=(), gpus=(), nodes=(), timeline: Timeline | None = None, duration: float = 120.0,
           step: float = 5.0) -> Window:
    return Window(job="j", start=T0, end=T0 + duration, step_s=step, interval_s=5.0, ranks=list(ranks),
                  gpus=list(gpus), nodes=list(nodes), timeline=timeline or Timeline())


def grid(duration: float = 120.0, step: float = 5.0) -> list[float]:
    return [T0 + i * step for i in range(int(duration / step) + 1)]


def node(host: str = "n0", **kw) -> NodeStats:
    base = dict(cpu_busy=0.3, mem_used=0.4, swap_used_b=0.0, swap_pages_per_s=0.0, nic_errors=0.0, ib_errors=0.0)
    base.update(kw)
    return NodeStats(host=host, **base)
