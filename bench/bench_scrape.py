"""One scrape's CPU in-process: window statistics plus rendering, this checkout beside another.

The agent's store is filled by its real sources (8 fake H100 GPUs with their charged call costs,
and this machine's host, network, disk and process sources) on a simulated clock at `--interval`
with a 10 s window. Each round reads every source once and puts the same readings into this
checkout's store and into the baseline's (its `agent/store.py` and `agent/exposition.py`, loaded
beside ours), then renders one scrape from each, in alternating order, as a scrape at the sampling
interval finds it (every cache the last put invalidated). The figure is the thread CPU of
`Renderer.render()` (window statistics, rendering, encoding; not the send) in microseconds, median
over the rounds; the two bodies are compared byte for byte every round.

    python bench/bench_scrape.py [--gpus 8] [--rounds 1000] [--interval 0.1] [--baseline OTHER_CHECKOUT]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _load(path: Path, name: str):
    """A module of another checkout, as `otel_gpu.agent.<name>` (its relative imports are ours)."""
    spec = importlib.util.spec_from_file_location(f"otel_gpu.agent.{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--baseline", type=Path, help="another checkout: its store and renderer beside ours")
    args = p.parse_args()

    from otel_gpu.agent import exposition, store
    from otel_gpu.agent.node import NodeConfig, build_node
    from otel_gpu.agent.sampler import Exported, Sampler

    kinds = {"this": (store.Store, exposition.Renderer)}
    if args.baseline:
        agent = args.baseline.resolve() / "otel_gpu" / "agent"
        kinds["baseline"] = (_load(agent / "store.py", "baseline_store").Store,
                             _load(agent / "exposition.py", "baseline_exposition").Renderer)
    clock = [1000.0]
    node = build_node(NodeConfig(fake_gpus=args.gpus, interval_s=args.interval))
    pipes = {}
    for label, (store_cls, renderer_cls) in kinds.items():
        sampler = Sampler(node.sources, store_cls(window_s=10.0), args.interval, clock=lambda: clock[0])
        renderer = renderer_cls(Exported(sampler).families, {"host.name": "bench-node", "otelgpu.job": "bench"},
                                {"service.name": "otel-gpu-agent", "host.name": "bench-node"})
        pipes[label] = (sampler.store, renderer)

    def one_round() -> None:
        clock[0] += args.interval
        for source in node.sources:
            readings = source.read()
            for st, _ in pipes.values():
                st.put(source.name, readings, clock[0])
        time.sleep(0.002)   # caches cool a little, as between the agent's rounds

    cpu_us = {label: [] for label in pipes}
    warm = int(10.0 / args.interval) + 5   # a full window first
    differ = 0
    for r in range(warm + args.rounds):
        one_round()
        bodies = {}
        for label in (list(pipes) if r % 2 else list(pipes)[::-1]):
            t0 = time.thread_time()
            bodies[label] = pipes[label][1].render()
            if r >= warm:
                cpu_us[label].append((time.thread_time() - t0) * 1e6)
        differ += len(set(bodies.values())) > 1
    node.close()
    body = bodies["this"]
    series = sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))
    print(f"{args.gpus} fake GPUs + host, interval {args.interval:g} s, window 10 s, {args.rounds} scrapes, "
          f"{series} series, {len(body)} B")
    for label, us in cpu_us.items():
        q = statistics.quantiles(us, n=4)
        print(f"{label}: median {statistics.median(us):.0f} us a scrape (quartiles {q[0]:.0f}, {q[2]:.0f})")
    if args.baseline:
        print(f"this / baseline: {statistics.median(cpu_us['this']) / statistics.median(cpu_us['baseline']):.2f}; "
              f"bodies differed in {differ} of {warm + args.rounds} scrapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
