"""A/B of the agent's CPU: a base revision and the working tree, side by side in one run.

Both agents (8 fake GPUs, or with --stub-gpus N that many GPUs through pynvml and the C stand-in
for libnvidia-ml in bench/nvml_stub; every host source, sampling every --interval s) start together
and are scraped together over one kept-alive connection each, at the sampling interval; their
utime+stime comes from /proc (10 ms ticks), and their threads' run time from
/proc/PID/task/*/schedstat (ns: a 2% change at 1 s is a few ticks in two minutes). The base
revision is checked out into a temporary git worktree.

    python bench/ab_agent.py --base HEAD~1 [--duration 120] [--interval 1] [--stub-gpus 8]
"""
from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_agent import build_stub, cpu_seconds  # noqa: E402
from bench.nvml_stub.build import NoCompiler  # noqa: E402


def run_ns(pid: int) -> int:
    """CPU time of `pid`'s live threads so far, ns (/proc/PID/task/*/schedstat: the scheduler's own
    count, not 10 ms ticks; a thread that ended takes its time with it: the agent's threads live on)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue   # the thread ended meanwhile
    return total
from tests.servers import free_port, wait_until  # noqa: E402


def start(tree: Path, port: int, interval: float, stub: Path | None = None) -> subprocess.Popen:
    """The agent of `tree` on 8 fake GPUs, or with `stub` on pynvml and the stand-in library there."""
    gpus = ["--fake-gpus", "8"] if stub is None else []
    env = {**os.environ, "LD_LIBRARY_PATH": str(stub)} if stub is not None else None
    return subprocess.Popen([sys.executable, "-m", "otel_gpu", "agent", "--no-live", *gpus,
                             "--interval", str(interval), "--prometheus-port", str(port)],
                            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def serving(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/metrics")
        return conn.getresponse().status == 200
    except OSError:
        return False


def scrape(ports: list[int], interval: float, stop: threading.Event) -> None:
    conns = [http.client.HTTPConnection("127.0.0.1", p, timeout=10) for p in ports]
    while not stop.wait(interval):
        for conn in conns:
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})   # as Prometheus asks
            conn.getresponse().read()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="git revision to compare the working tree with")
    p.add_argument("--duration", type=float, default=120.0, help="seconds measured")
    p.add_argument("--interval", type=float, default=1.0, help="sampling and scrape interval, seconds")
    p.add_argument("--stub-gpus", type=int, default=None, metavar="N",
                   help="N GPUs through pynvml and the C stand-in for libnvidia-ml (bench/nvml_stub) "
                        "instead of 8 fake GPUs")
    args = p.parse_args()
    if args.stub_gpus is not None and not 1 <= args.stub_gpus <= 64:
        print("--stub-gpus: a count of GPUs from 1 to 64 (the stand-in's most)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ab-agent-") as tmp:
        stub = None
        if args.stub_gpus is not None:
            try:
                stub = build_stub(Path(tmp) / "nvml-stub")
            except NoCompiler as err:
                print(f"--stub-gpus: {err}", file=sys.stderr)
                return 2
            os.environ["STUB_NVML_GPUS"] = str(args.stub_gpus)
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        ports = [free_port(), free_port()]
        procs = [start(base, ports[0], args.interval, stub), start(ROOT, ports[1], args.interval, stub)]
        stop = threading.Event()
        try:
            for port in ports:
                wait_until(lambda: serving(port), 60, f"agent on port {port}")
            threading.Thread(target=scrape, args=(ports, args.interval, stop), daemon=True).start()
            time.sleep(3)   # warm: first scrapes served, GPM has two samples
            before = [(cpu_seconds(proc.pid), run_ns(proc.pid)) for proc in procs]
            time.sleep(args.duration)
            used = [cpu_seconds(proc.pid) - b[0] for proc, b in zip(procs, before)]
            used_ns = [run_ns(proc.pid) - b[1] for proc, b in zip(procs, before)]
        finally:
            stop.set()
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    print(f"{args.duration:g} s at {args.interval:g} s: base {args.base} {used[0]:.2f} CPU-s, "
          f"working tree {used[1]:.2f} CPU-s, ratio tree/base {used[1] / max(used[0], 1e-9):.2f}; "
          f"threads' run time (schedstat) base {used_ns[0] / 1e6 / args.duration:.3f} ms/s, "
          f"working tree {used_ns[1] / 1e6 / args.duration:.3f} ms/s, ratio {used_ns[1] / max(used_ns[0], 1):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
