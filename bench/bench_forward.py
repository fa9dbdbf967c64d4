"""Cost of timing a plain loop's model call as "forward", side by side with it off, in one run.

One process, one torch thread, a model of many small modules (--blocks blocks of Linear, LayerNorm,
ReLU: 3 modules each plus the containers) so a per-module cost would show. Interleaved rounds:

- `off`: the other hooks (optimizer, backward, data wait) installed, the forward hooks not;
- `on`: the forward hooks installed and the model found (the global hook gone): the steady state;
- `search`: the model call while the global module hook is still looking for the model (the first
  step of a run), forward only.

Prints the median training step (forward, backward, optimizer) of `off` and `on` and their ratio,
the median forward of `off` and `search` and their ratio, and the added microseconds; each as wall
time and as the training thread's CPU time (which another process's load blurs less).

    python bench/bench_forward.py [--rounds 15] [--steps 30] [--blocks 32]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OTELGPU_PROFILE", "0")
for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
    os.environ.pop(k, None)   # the session records into its in-process instruments, nothing is sent

import torch  # noqa: E402

from otel_gpu.training import forward, session, torch_hooks  # noqa: E402


def build(blocks: int):
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), torch.randn(16, 64), torch.randn(16, 1)


def steps(model, opt, x, y, n: int) -> tuple[float, float]:
    """Median (wall, thread CPU) seconds of `n` training steps."""
    loss_fn = torch.nn.MSELoss()
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def forwards(model, x, n: int) -> tuple[float, float]:
    """Median (wall, thread CPU) seconds of `n` model calls (no step boundary: a search stays on)."""
    wall, cpu = [], []
    with torch.no_grad():
        for _ in range(n):
            t0, c0 = time.perf_counter(), time.thread_time()
            model(x)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--blocks", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    session.current()
    torch_hooks.install()
    model, opt, x, y = build(args.blocks)
    modules = sum(1 for _ in model.modules())
    steps(model, opt, x, y, 5)   # warm-up
    off_step, on_step, off_fwd, search_fwd = [], [], [], []
    for _ in range(args.rounds):
        forward.uninstall()
        off_step.append(steps(model, opt, x, y, args.steps))
        off_fwd.append(forwards(model, x, args.steps))
        forward.install()
        search_fwd.append(forwards(model, x, args.steps))
        steps(model, opt, x, y, 2)   # two step boundaries: the model is found, the global hook removed
        assert not forward.searching()
        on_step.append(steps(model, opt, x, y, args.steps))
    forward.uninstall()
    timer = session.timer()
    assert timer is not None and "forward" in timer.phase_totals()

    print(f"model: {modules} modules; {args.rounds} rounds x {args.steps} steps; one torch thread; medians of rounds")
    print(f"{'':38} {'off':>10} {'on':>10} {'ratio':>6} {'added':>10}")
    rows = (("training step, model found", off_step, on_step), ("model call, still searching", off_fwd, search_fwd))
    for label, off, on in rows:
        for i, clock in ((0, "wall"), (1, "thread CPU")):
            a, b = statistics.median(r[i] for r in off), statistics.median(r[i] for r in on)
            print(f"{label + ', ' + clock:38} {a * 1e3:7.3f} ms {b * 1e3:7.3f} ms {b / a:6.3f} {(b - a) * 1e6:+7.1f} us")
    a, b = statistics.median(r[1] for r in off_fwd), statistics.median(r[1] for r in search_fwd)
    print(f"search cost per module call (CPU): {(b - a) / modules * 1e6:.2f} us, paid until the first step "
          "boundary after the model is found")


if __name__ == "__main__":
    main()
