"""Cost of training-side telemetry, side by side in one run, on a real CPU training loop.

Configurations (each a fresh worker process, run in interleaved rounds A B C D A B C D ...
so machine noise hits all of them alike):

  none      telemetry off (OTELGPU_TRAINING=0)
  metrics   step/phase metrics, OTLP export every second to a local HTTP sink
  profile   metrics + pyroscope-io at the chosen settings (wall clock, all threads, 100 Hz)
  cpu-gil   metrics + pyroscope-io at its defaults (on-CPU, GIL holder only, 100 Hz), for comparison

The loop: an MLP on one torch thread, sized so a step (forward, backward, optimizer) takes
about --step-ms. Reported: median step time per configuration over all rounds and its ratio
to `none`, process CPU seconds per step, and the direct cost of the hooks per step
(`with step()` + 4 phases, measured in a tight loop without a model).

    python bench/bench_training.py [--rounds 5] [--steps 60] [--step-ms 50]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "none": {"OTELGPU_TRAINING": "0"},
    "metrics": {"OTELGPU_PROFILE": "0"},
    "profile": {"OTELGPU_PROFILE_MODE": "wall", "OTELGPU_PROFILE_THREADS": "all"},
    "cpu-gil": {"OTELGPU_PROFILE_MODE": "cpu", "OTELGPU_PROFILE_THREADS": "gil"},
}


# ---- worker: one training run ---------------------------------------------------
def worker(steps: int, width: int, warmup: int) -> None:
    import torch

    from otel_gpu import training as otg

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 16))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, width), torch.randn(64, 16)
    times = []
    cpu0 = time.process_time()
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        with otg.step(samples=64):
            with otg.phase("data_wait"):
                xb, yb = x.clone(), y.clone()
            with otg.phase("forward"):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
            with otg.phase("backward"):
                loss.backward()
            with otg.phase("optimizer"):
                opt.step()
                opt.zero_grad()
        if i == warmup - 1:
            cpu0 = time.process_time()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    otg.shutdown()
    print(json.dumps({"steps": times, "cpu_per_step": cpu / steps}))


def calibrate(step_ms: float) -> int:
    """Model width whose step takes about `step_ms` on this machine (one torch thread)."""
    import torch

    torch.set_num_threads(1)
    width = 256
    while True:
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                    torch.nn.ReLU(), torch.nn.Linear(width, 16))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(64, width), torch.randn(64, 16)
        samples = []
        for _ in range(8):
            t0 = time.perf_counter()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            samples.append(time.perf_counter() - t0)
        ms = statistics.median(samples[2:]) * 1000
        if ms >= step_ms or width >= 16384:
            return width
        width = int(width * max(1.1, min(2.0, (step_ms / ms) ** 0.5)))


def hook_cost_us(n: int = 20000) -> float:
    """Cost of `with step()` + 4 phases with live OTel instruments (no model), microseconds."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gpu.training.session import Session

    timer = Session(dict(os.environ, OTELGPU_PROFILE="0"), readers=[InMemoryMetricReader()], profile=False).timer
    names = ("data_wait", "forward", "backward", "optimizer")
    t0 = time.perf_counter()
    for _ in range(n):
        with timer.step(samples=64):
            for name in names:
                timer.enter(name)
                timer.exit(name)
    return (time.perf_counter() - t0) / n * 1e6


# ---- parent ------------------------------------------------------------------
class Sink:
    """Answers 200 to every POST (stands in for the OTLP receiver and Pyroscope)."""

    def __init__(self):
        sink = self
        self.requests = 0

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                sink.requests += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a):
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def run_one(config: str, sink: Sink, steps: int, width: int, warmup: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env.update({"PYTHONPATH": str(ROOT), "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_METRIC_EXPORT_INTERVAL": "1000",
                "OTELGPU_PYROSCOPE_URL": sink.url, "OTELGPU_JOB": "bench", "OMP_NUM_THREADS": "1"})
    env.update(CONFIGS[config])
    out = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(steps), "--width", str(width),
                          "--warmup", str(warmup)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--width", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.steps, args.width, args.warmup)
        return 0

    width = calibrate(args.step_ms)
    sink = Sink()
    per = {c: [] for c in CONFIGS}
    cpu = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for config in CONFIGS:
            res = run_one(config, sink, args.steps, width, args.warmup)
            per[config].append(statistics.median(res["steps"]))
            cpu[config].append(res["cpu_per_step"])
        print(f"round {r + 1}/{args.rounds}: " + "  ".join(f"{c} {per[c][-1] * 1000:.2f} ms" for c in CONFIGS), flush=True)
    hooks = hook_cost_us()
    base = statistics.median(per["none"])
    base_cpu = statistics.median(cpu["none"])
    print(f"\nCPU training loop, MLP width {width}, one torch thread, {args.rounds} rounds x {args.steps} steps; "
          f"{sink.requests} pushes received by the sink")
    print("step = median over runs of each run's median step; paired = median over rounds of config/none in "
          "the same round (cancels load drift); best = fastest run / fastest none run")
    print(f"{'config':<10} {'step ms':>9} {'ratio':>8} {'paired':>8} {'best':>8} {'CPU ms/step':>12} {'CPU ratio':>10}")
    paired = {}
    for config in CONFIGS:
        step = statistics.median(per[config])
        paired[config] = statistics.median(a / b for a, b in zip(per[config], per["none"]))
        best = min(per[config]) / min(per["none"])
        c = statistics.median(cpu[config])
        print(f"{config:<10} {step * 1000:9.2f} {step / base:8.4f} {paired[config]:8.4f} {best:8.4f} "
              f"{c * 1000:12.2f} {c / base_cpu:10.4f}")
    print(f"\nhooks alone: {hooks:.1f} us per step (step() + 4 phases) = {hooks / (base * 1e6) * 100:.3f} % of a "
          f"{base * 1000:.0f} ms step")
    print(f"metrics overhead (paired):   {(paired['metrics'] - 1) * 100:+.2f} % (bar: < 0.5 %)")
    print(f"profiling overhead (paired): {(paired['profile'] - 1) * 100:+.2f} % (bar: < 3 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
