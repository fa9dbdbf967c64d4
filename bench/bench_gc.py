"""Cost of timing Python's garbage collector (otel_gpu/training/gc_clock.py) per collection and per step.

Per collection: gen-0 collections of an empty young generation (the cheapest a collection gets, so the
callback's two calls are the largest share of it), timed with and without the clock's callback installed,
median of rounds: the difference is the callback's cost. Per step: a small CPU training step (torch, a
2-layer MLP, forward, backward, SGD) run with and without the callback, counting the collections the step
triggers; the callback's cost per step is (collections per step) x (cost per collection), printed beside
the step time. Wall and thread-CPU time (wall on a loaded machine includes preemption).

    python bench/bench_gc.py [--rounds 9] [--collections 20000] [--steps 200]
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

from otel_gpu.training.gc_clock import GcClock


def per_collection_us(n: int, rounds: int, clock: GcClock | None) -> tuple[float, float]:
    """(wall, thread CPU) microseconds per gen-0 collection, medians over `rounds`."""
    if clock is not None:
        clock.install()
    wall, cpu = [], []
    try:
        for _ in range(rounds):
            t, c = time.perf_counter(), time.thread_time()
            for _ in range(n):
                gc.collect(0)
            wall.append((time.perf_counter() - t) / n * 1e6)
            cpu.append((time.thread_time() - c) / n * 1e6)
    finally:
        if clock is not None:
            clock.uninstall()
    return statistics.median(wall), statistics.median(cpu)


def step_ms_and_collections(steps: int, clock: GcClock | None) -> tuple[float, float]:
    """(median step ms, collections per step) of a small CPU training step."""
    import torch
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randn(64, 16)
    probe = GcClock()
    probe.install()
    if clock is not None:
        clock.install()
    times = []
    try:
        for _ in range(steps):
            t = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t)
    finally:
        probe.uninstall()
        if clock is not None:
            clock.uninstall()
    return statistics.median(times) * 1000, sum(probe.count) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--collections", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    gc.collect()
    bare, bare_cpu = per_collection_us(a.collections, a.rounds, None)
    timed, timed_cpu = per_collection_us(a.collections, a.rounds, GcClock())
    cost, cost_cpu = timed - bare, timed_cpu - bare_cpu
    print(f"gen-0 collection: {bare:.3f} us bare, {timed:.3f} us with the GC clock: +{cost:.3f} us wall, "
          f"+{cost_cpu:.3f} us CPU per collection")
    step_off, n = step_ms_and_collections(a.steps, None)
    step_on, _ = step_ms_and_collections(a.steps, GcClock())
    per_step = n * max(cost_cpu, 0.0)
    print(f"small CPU step: {step_off:.3f} ms without, {step_on:.3f} ms with the GC clock; {n:.2f} collections "
          f"per step x {max(cost_cpu, 0.0):.3f} us = {per_step:.3f} us per step "
          f"({per_step / (step_off * 1000):.1e} of the step)")


if __name__ == "__main__":
    main()
