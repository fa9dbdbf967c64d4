"""The agent's scrape endpoint under connection floods, side by side with node_exporter.

Both run at the same time, each limited to NOFILE descriptors (`prlimit` after start):
1. burst: BURST clients connect at once and scrape (a new connection each);
2. idle flood: IDLE connections that never send a request (more than NOFILE), then one scrape.
Printed per target: scrapes answered, p50 / p99 / max latency (s), and our figure over
node_exporter's.

    python bench/bench_scrape_flood.py [--burst 300] [--idle 600] [--nofile 256] [--repeat 3]
"""
from __future__ import annotations

import argparse
import http.client
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.servers import NodeExporter, free_port, wait_until  # noqa: E402


def scrape(port: int, timeout: float = 15.0) -> float | None:
    """Seconds for one scrape on a new connection; None when it failed."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        resp.read()
        return time.monotonic() - t0 if resp.status == 200 else None
    except OSError:
        return None
    finally:
        conn.close()


def burst(port: int, clients: int) -> list[float | None]:
    results: list[float | None] = []
    gate = threading.Barrier(clients)

    def one():
        gate.wait()
        results.append(scrape(port))

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def idle_flood(port: int, idle: int) -> float | None:
    socks = []
    try:
        for _ in range(idle):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break   # the backlog is full: the flood is as large as it gets
        return scrape(port, timeout=30)
    finally:
        for s in socks:
            s.close()


def stats(latencies: list[float | None]) -> tuple[int, float, float, float]:
    ok = sorted(x for x in latencies if x is not None)
    if not ok:
        return 0, float("nan"), float("nan"), float("nan")
    return len(ok), statistics.median(ok), ok[min(len(ok) - 1, int(0.99 * len(ok)))], ok[-1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--burst", type=int, default=300)
    p.add_argument("--idle", type=int, default=600)
    p.add_argument("--nofile", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    need = max(args.burst, args.idle) + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))

    port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "otel_gpu", "agent", "--no-live", "--no-gpu", "--interval", "1",
                              "--prometheus-port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeExporter(tmpdir=Path(tmp) / "ne", collectors=("cpu", "meminfo", "diskstats", "netdev")).start()
        try:
            targets = {"agent": (agent.pid, port), "node_exporter": (node.pid, node.port)}
            for name, (pid, tport) in targets.items():
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (args.nofile, args.nofile))
                wait_until(lambda: scrape(tport, 2), 60, f"{name} endpoint")
            rows = {name: {"burst": [], "idle": []} for name in targets}
            for _ in range(args.repeat):
                for name, (_, tport) in targets.items():
                    rows[name]["burst"] += burst(tport, args.burst)
                    rows[name]["idle"].append(idle_flood(tport, args.idle))
                    time.sleep(1)
        finally:
            node.stop()
            agent.terminate()
            agent.wait(10)
    print(f"descriptor limit {args.nofile}; burst of {args.burst} new-connection scrapes and a flood of "
          f"{args.idle} idle connections then one scrape, {args.repeat} times each\n")
    print("| target | burst answered | p50 s | p99 s | max s | after idle flood: answered | its latency s (median) |")
    print("|---|---|---|---|---|---|---|")
    figures = {}
    for name, r in rows.items():
        n, p50, p99, worst = stats(r["burst"])
        idle_ok = [x for x in r["idle"] if x is not None]
        idle_median = statistics.median(idle_ok) if idle_ok else float("nan")
        figures[name] = (n, p99, idle_median, len(idle_ok))
        print(f"| {name} | {n}/{len(r['burst'])} | {p50:.3f} | {p99:.3f} | {worst:.3f} | "
              f"{len(idle_ok)}/{len(r['idle'])} | {idle_median:.3f} |")
    ours, peer = figures["agent"], figures["node_exporter"]
    print(f"\nagent / node_exporter: burst p99 {ours[1] / peer[1]:.2f}x, "
          f"answered after the idle flood {ours[3]}/{args.repeat} vs {peer[3]}/{args.repeat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
