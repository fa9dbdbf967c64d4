"""Cost of training-side telemetry, side by side in one run, on a real CPU training loop.

Configurations (each a fresh worker process, run in interleaved rounds A B C D A B C D ...
so machine noise hits all of them alike):

  none      telemetry off (OTELGPU_TRAINING=0)
  metrics   step/phase metrics, OTLP export every second to a local HTTP sink
  profile   metrics + pyroscope-io at the chosen settings (wall clock, all threads, 50 Hz)
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
    "profile": {"OTELGPU_PROFILE_MODE": "wall", "OTELGPU_PROFILE_THREADS": "all", "OTELGPU_PROFILE_RATE": "50"},
    "cpu-gil": {"OTELGPU_PROFILE_MODE": "cpu", "OTELGPU_PROFILE_THREADS": "gil", "OTELGPU_PROFILE_RATE": "100"},
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
    times, thread_cpu = [], []
    cpu0 = time.process_time()
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.thread_time()
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
            thread_cpu.append(time.thread_time() - c0)
    cpu = time.process_time() - cpu0
    otg.shutdown()
    print(json.dumps({"steps": times, "cpu_per_step": cpu / steps, "thread_cpu": statistics.median(thread_cpu)}))


def idle_worker(threads: int, seconds: float) -> None:
    """CPU the process uses while its training thread sleeps: the sampler's own cost (robust to load)."""
    import threading

    from otel_gpu import training as otg

    with otg.phase("forward"):     # starts telemetry (and the profiler, if configured)
        pass
    stop = threading.Event()
    for _ in range(threads):
        threading.Thread(target=stop.wait, daemon=True).start()
    time.sleep(0.5)
    c0, t0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    print(json.dumps({"cpu_per_s": (time.process_time() - c0) / (time.perf_counter() - t0)}))


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
        ms = min(samples[2:]) * 1000   # the least disturbed run: steps are at least step_ms
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


def _env(sink: Sink, config: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env.update({"PYTHONPATH": str(ROOT), "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_METRIC_EXPORT_INTERVAL": "1000",
                "OTELGPU_PYROSCOPE_URL": sink.url, "OTELGPU_JOB": "bench", "OMP_NUM_THREADS": "1"})
    env.update(config)
    return env


def run_one(config: str, sink: Sink, steps: int, width: int, warmup: int) -> dict:
    env = _env(sink, CONFIGS[config])
    out = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(steps), "--width", str(width),
                          "--warmup", str(warmup)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _idle_cost(sink: Sink, config: dict, threads: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--idle", str(threads)], env=_env(sink, config),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["cpu_per_s"] * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--width", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--idle", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.steps, args.width, args.warmup)
        return 0
    if args.idle >= 0:
        idle_worker(args.idle, 4.0)
        return 0

    width = calibrate(args.step_ms)
    sink = Sink()
    per = {c: [] for c in CONFIGS}
    cpu = {c: [] for c in CONFIGS}
    tcpu = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for config in CONFIGS:
            res = run_one(config, sink, args.steps, width, args.warmup)
            per[config].append(statistics.median(res["steps"]))
            cpu[config].append(res["cpu_per_step"])
            tcpu[config].append(res["thread_cpu"])
        print(f"round {r + 1}/{args.rounds}: " + "  ".join(f"{c} {per[c][-1] * 1000:.2f} ms" for c in CONFIGS), flush=True)
    hooks = hook_cost_us()
    med = {c: statistics.median(per[c]) for c in CONFIGS}
    paired = {c: statistics.median(a / b for a, b in zip(per[c], per["none"])) for c in CONFIGS}
    thread = {c: statistics.median(tcpu[c]) for c in CONFIGS}
    proc = {c: statistics.median(cpu[c]) for c in CONFIGS}
    print(f"\nCPU training loop, MLP width {width}, one torch thread, {args.rounds} rounds x {args.steps} steps; "
          f"{sink.requests} pushes received by the sink")
    print("wall: median step (ms) and its ratio to none, paired by round (cancels load drift);")
    print("train-thread CPU: CPU time of the training thread per step (what our hooks add to the step);")
    print("process CPU: all threads per step (adds the exporter and the sampler, which can run on another core)")
    print(f"{'config':<10} {'wall ms':>8} {'paired':>8} {'thread ms':>10} {'ratio':>8} {'proc ms':>8} {'ratio':>8}")
    for c in CONFIGS:
        print(f"{c:<10} {med[c] * 1000:8.2f} {paired[c]:8.4f} {thread[c] * 1000:10.2f} {thread[c] / thread['none']:8.4f} "
              f"{proc[c] * 1000:8.2f} {proc[c] / proc['none']:8.4f}")
    step = med["none"]
    print(f"\nhooks alone: {hooks:.1f} us per step (step() + 4 phases) = {hooks / (step * 1e6) * 100:.3f} % of a "
          f"{step * 1000:.0f} ms step")
    for c, bar in (("metrics", 0.5), ("profile", 3.0)):
        print(f"{c:<8} overhead: train thread {(thread[c] / thread['none'] - 1) * 100:+.2f} %, process CPU "
              f"{(proc[c] / proc['none'] - 1) * 100:+.2f} %, wall (paired) {(paired[c] - 1) * 100:+.2f} %  (bar: < {bar} %)")

    print("\nsampler cost: CPU of an otherwise idle rank, ms per second (1 ms/s = 0.1 % of one core), "
          "best of 3, with 0 and 8 extra idle Python threads")
    print(f"{'config':<16} {'+0 threads':>11} {'+8 threads':>11}")
    for name, cfg in (("metrics only", CONFIGS["metrics"]), ("cpu-gil 100 Hz", CONFIGS["cpu-gil"]),
                      ("wall-all 100 Hz", {**CONFIGS["profile"], "OTELGPU_PROFILE_RATE": "100"}),
                      ("wall-all 50 Hz", CONFIGS["profile"]),
                      ("wall-all 20 Hz", {**CONFIGS["profile"], "OTELGPU_PROFILE_RATE": "20"})):
        row = [min(_idle_cost(sink, cfg, threads) for _ in range(3)) for threads in (0, 8)]
        print(f"{name:<16} {row[0]:11.1f} {row[1]:11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
