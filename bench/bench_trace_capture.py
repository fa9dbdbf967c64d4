"""The job's own step time outside the captured steps, with and without `otel-gpu run --trace-steps`.

    python bench/bench_trace_capture.py [--steps 400] [--capture 100-109] [--rounds 3] [--ranks 2]

Runs a small 2-rank gloo training job (torchrun, CPU, no otel-gpu code in it) under
`otel-gpu run --record --no-agent --no-report`, alternating runs without and with `--trace-steps`,
`--rounds` of each (default 5). Rank 0 times every step itself (perf_counter at each step's end: an untouched
job's own view). Prints, per run and as the median over the rounds: the median step outside steps
A-1..B+1 (in the job's view the profiler starts inside step A-1, at its optimizer step, and stops and
writes the trace inside step B or B+1), the captured steps' median, the slowest step of A-1..B+1
(the stop and the write), and the ratio with/without; and rank 0's capture end by part, from its trace status
(`stop_parts_s`: the profiler's stop, the Chrome-trace export, the gzip and rename).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def job(steps: int, out: str) -> None:
    """The training job (run by torchrun): no otel-gpu import; rank 0 writes its step end times to `out`."""
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    ends = []
    for _ in range(steps):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        ends.append((time.perf_counter(), time.process_time()))
    dist.barrier()
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(ends))
    dist.destroy_process_group()


def one_run(steps: int, capture: str | None, ranks: int, port: int) -> tuple[list[float], list[float], dict]:
    """Rank 0's step seconds of one run under `otel-gpu run`, wall clock and the rank's CPU time: element
    k - 1 is step k as the ranks count it (step 1 opens at the first optimizer step, closes at the second);
    and rank 0's `stop_parts_s` from its trace status (the capture's stop, export and write, s; {} without)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "ends.json"
        cmd = [sys.executable, "-m", "otel_gpu", "run", "--record", str(Path(d) / "run"), "--no-agent", "--no-report",
               "--no-live"] + (["--trace-steps", capture] if capture else []) + [
            "--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
            str(port), __file__, "--job", str(steps), str(out)]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=900)
        ends = json.loads(out.read_text())
        status = [json.loads(p.read_text()) for p in (Path(d) / "run" / "traces" / "ranks").glob("rank0-*.json")]
    parts = (status[0].get("stop_parts_s") or {}) if status else {}
    return ([b[0] - a[0] for a, b in zip(ends, ends[1:])],    # [0] is the ranks' step 1 (opened at the first end)
            [b[1] - a[1] for a, b in zip(ends, ends[1:])], parts)


def hook_cost(n: int = 200_000, repeat: int = 5) -> tuple[float, float, float]:
    """CPU ns per step boundary of the Timer alone, with a watching capture listener (a trace folder set,
    no capture armed: what every step of a recorded run pays), and with a capture armed for a step never
    reached: the best of `repeat` runs of `n` boundaries each (process CPU time)."""
    import time

    from otel_gpu.training.timing import Timer
    from otel_gpu.training.trace_capture import Capture

    class Sink:
        def step(self, *a):
            pass

    def per_step(listener) -> float:
        best = float("inf")
        for _ in range(repeat):
            t = Timer(Sink())
            t.step_listener = listener
            t0 = time.process_time()
            for _ in range(n):
                t.mark_step("optimizer")
            best = min(best, (time.process_time() - t0) / n * 1e9)
        return best

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "ranks").mkdir()
        return (per_step(None), per_step(Capture(Path(d), "0", watch=True)),
                per_step(Capture(Path(d), "0", window=(10**9, 10**9), watch=True)))


def summarise(times: tuple[list[float], list[float], dict], a: int, b: int) -> dict:
    """Median of the steps outside a-1..b+1 (wall and CPU), of a..b, and the slowest of a-1..b+1 (steps
    from 1), in ms; rank 0's capture stop, export and write (ms, where its status has them)."""
    wall, cpu = (dict(enumerate(x, 1)) for x in times[:2])
    outside = [n for n in wall if not a - 1 <= n <= b + 1]
    return {"outside_ms": 1000 * statistics.median(wall[n] for n in outside),
            "outside_cpu_ms": 1000 * statistics.median(cpu[n] for n in outside),
            "before_cpu_ms": 1000 * statistics.median(cpu[n] for n in outside if n < a),
            "after_cpu_ms": 1000 * statistics.median(cpu[n] for n in outside if n > b),
            "captured_ms": 1000 * statistics.median(wall[n] for n in wall if a <= n <= b),
            "slowest_ms": 1000 * max(wall[n] for n in wall if a - 1 <= n <= b + 1),
            **{f"{k}_ms": 1000 * v for k, v in times[2].items() if isinstance(v, (int, float))}}


def _parts(s: dict) -> str:
    """The capture's end by part, as the rank's status gives it: stop, export, write (ms)."""
    if "stop_ms" not in s:
        return ""
    return (f"; the capture's end: stop {s['stop_ms']:.1f} ms, export {s['export_ms']:.1f} ms, "
            f"write (gzip, rename) {s['write_ms']:.1f} ms")


def main() -> int:
    if sys.argv[1:2] == ["--job"]:
        job(int(sys.argv[2]), sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--capture", default="100-109")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    a, b = (int(x) for x in args.capture.split("-"))
    bare, watching, armed = hook_cost()
    print(f"step boundary, CPU: {bare:.0f} ns bare; {watching:.0f} ns with the capture listener watching a trace "
          f"folder (+{watching - bare:.0f} ns); {armed:.0f} ns with a capture armed (+{armed - bare:.0f} ns)", flush=True)
    without, with_ = [], []
    for r in range(args.rounds):
        for capture, bucket in ((None, without), (args.capture, with_)):
            s = summarise(one_run(args.steps, capture, args.ranks, 29500 + 2 * r + (capture is not None)), a, b)
            bucket.append(s)
            print(f"round {r + 1} {'with' if capture else 'without'} --trace-steps {args.capture}: median step outside "
                  f"{a - 1}-{b + 1} {s['outside_ms']:.2f} ms (CPU {s['outside_cpu_ms']:.2f} ms: {s['before_cpu_ms']:.2f} before, "
                  f"{s['after_cpu_ms']:.2f} after); steps {a}-{b} {s['captured_ms']:.2f} ms; "
                  f"slowest of {a - 1}-{b + 1} {s['slowest_ms']:.2f} ms" + _parts(s), flush=True)
    ratios = [w["outside_ms"] / o["outside_ms"] for w, o in zip(with_, without)]
    cpu = [w["outside_cpu_ms"] / o["outside_cpu_ms"] for w, o in zip(with_, without)]
    med = {k: statistics.median(x[k] for x in with_) for k in with_[0]}
    base = {k: statistics.median(x[k] for x in without) for k in without[0]}
    print(f"rank 0, median over {args.rounds} rounds{_parts(med) or ': the capture end is not in its status'}")
    print(f"median over {args.rounds} rounds, {args.ranks} ranks, {args.steps} steps: outside the capture "
          f"{med['outside_ms']:.2f} ms with vs {base['outside_ms']:.2f} ms without = "
          f"{med['outside_ms'] / base['outside_ms']:.3f}x (median of the rounds' own ratios "
          f"{statistics.median(ratios):.3f}x, from {min(ratios):.3f}x to {max(ratios):.3f}x); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; the rank's CPU a step outside the capture "
          f"{med['outside_cpu_ms']:.2f} ms with vs {base['outside_cpu_ms']:.2f} ms without = "
          f"{med['outside_cpu_ms'] / base['outside_cpu_ms']:.3f}x (rounds' own ratios {statistics.median(cpu):.3f}x, "
          f"{min(cpu):.3f}x to {max(cpu):.3f}x); captured steps {med['captured_ms']:.2f} ms "
          f"({med['captured_ms'] / base['captured_ms']:.2f}x the same steps without); slowest of {a - 1}-{b + 1} "
          f"{med['slowest_ms']:.2f} ms with vs {base['slowest_ms']:.2f} ms without (the profiler's stop and write)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
