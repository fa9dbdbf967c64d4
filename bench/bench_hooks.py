"""Cost of the data-wait and collective-wait hooks, side by side with the hooks off, in one run.

Per call: the added time of one hooked call over the plain call, for the calls a step makes:
DataLoader `next()` (data_wait phase), a synchronous `dist.all_reduce` (gloo, world size 1, 1 KiB),
an `async_op=True` all-reduce plus its `Work.wait()`, `torch.autograd.backward` (backward phase).
Each is timed in interleaved rounds (plain, hooked, plain, hooked, ...), median of the rounds.

Per step: a DDP training loop (world size 1, gloo, an MLP sized to about --step-ms per step) run
with the hooks off and on in interleaved rounds, median step time of each and their ratio; and the
per-call costs times the calls of a typical step (1 batch, 1 backward, --collectives collective
calls with their waits, the DDP bucket hook) against a 50 ms step.

    python bench/bench_hooks.py [--rounds 7] [--calls 2000] [--steps 40] [--collectives 64]
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
import torch.distributed as dist  # noqa: E402

from otel_gpu.training import collectives, session, torch_hooks  # noqa: E402


def hooks(on: bool) -> None:
    if on:
        torch_hooks.install_phases()
        collectives.install()
    else:
        torch_hooks.uninstall()
        collectives.uninstall()


def per_call(fn, calls: int) -> float:
    """Seconds per call of `fn` over `calls` calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def interleaved(fn, calls: int, rounds: int) -> tuple[float, float]:
    """(median s per call hooks off, median s per call hooks on)."""
    off, on = [], []
    for _ in range(rounds):
        hooks(False)
        off.append(per_call(fn, calls))
        hooks(True)
        on.append(per_call(fn, calls))
    hooks(False)
    return statistics.median(off), statistics.median(on)


def calls_under_test():
    x = torch.ones(256)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(10**6, 1)), batch_size=None)
    it = [iter(loader)]

    def next_batch():
        try:
            next(it[0])
        except StopIteration:
            it[0] = iter(loader)

    w = torch.ones(4, requires_grad=True)

    def backward():
        (w * 2).sum().backward()

    def async_wait():
        dist.all_reduce(x, async_op=True).wait()

    return {"DataLoader next()": next_batch, "all_reduce (sync)": lambda: dist.all_reduce(x),
            "all_reduce async + wait()": async_wait, "autograd backward": backward}


def wrapper_cost(calls: int, rounds: int) -> tuple[float, float]:
    """(s per call of a no-op, s per call of the same no-op inside the collective wrapper): our own
    cost per collective, without the collective's noise."""
    from torch.distributed import distributed_c10d as c10d

    def noop():
        return None

    timed = collectives._timed(noop, "all_reduce", c10d.Work)
    plain, wrapped = [], []
    for _ in range(rounds):
        plain.append(per_call(noop, calls * 10))
        wrapped.append(per_call(timed, calls * 10))
    return statistics.median(plain), statistics.median(wrapped)


def ddp_steps(steps: int, width: int) -> list[float]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                              torch.nn.ReLU(), torch.nn.Linear(width, 16))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(steps * 32, 256),
                                                                      torch.randn(steps * 32, 16)), batch_size=32)
    out = []
    t = time.perf_counter()
    for x, y in data:
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        now = time.perf_counter()
        out.append(now - t)
        t = now
    return out[3:]


def ddp_hook_variants(steps: int, width: int, rounds: int) -> dict[str, float]:
    """Median step (s) of a DDP loop with no comm hook, torch's allreduce_hook, and ours (`_average`)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    hooks(False)
    x, y = torch.randn(32, 256), torch.randn(32, 16)
    out: dict[str, list[float]] = {"no hook": [], "torch allreduce_hook": [], "otel-gpu hook": []}
    for _ in range(rounds):
        for name, hook in (("no hook", None), ("torch allreduce_hook", default_hooks.allreduce_hook),
                           ("otel-gpu hook", collectives._average)):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                      torch.nn.ReLU(), torch.nn.Linear(width, 16))
            model = DDP(net)
            if hook is not None:
                model.register_comm_hook(None, hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for i in range(steps):
                t = time.perf_counter()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                if i >= 3:
                    out[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=2048, help="MLP width (about 40-50 ms a step on this machine)")
    ap.add_argument("--collectives", type=int, default=64, help="collective calls (each waited) in a typical step")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
    dist.init_process_group("gloo")
    s = session.current()
    s.timer.begin_step("user")   # collective waits count inside steps: keep one open
    print(f"per call ({a.calls} calls x {a.rounds} interleaved rounds, median):")
    added = {}
    for name, fn in calls_under_test().items():
        off, on = interleaved(fn, a.calls, a.rounds)
        added[name] = on - off
        print(f"  {name:28s} off {off * 1e6:8.2f} us  on {on * 1e6:8.2f} us  added {(on - off) * 1e6:7.2f} us")
    plain, wrapped = wrapper_cost(a.calls, a.rounds)
    per_collective = max(0.0, wrapped - plain)
    print(f"  {'collective wrapper (no-op)':28s} off {plain * 1e6:8.2f} us  on {wrapped * 1e6:8.2f} us  "
          f"added {per_collective * 1e6:7.2f} us")
    typical = (max(0.0, added["DataLoader next()"]) + max(0.0, added["autograd backward"])
               + a.collectives * 2 * per_collective)   # a call and its wait
    print(f"typical step (1 batch, 1 backward, {a.collectives} collectives each waited): "
          f"{typical * 1e6:.1f} us = {typical / 0.050:.3%} of a 50 ms step (bar 1%)")
    offs, ons = [], []
    for _ in range(max(3, a.rounds // 2)):
        hooks(False)
        offs += ddp_steps(a.steps, a.width)
        hooks(True)
        ons += ddp_steps(a.steps, a.width)
    hooks(False)
    m_off, m_on = statistics.median(offs), statistics.median(ons)
    print(f"DDP loop (world 1, gloo): median step off {m_off * 1e3:.2f} ms, on {m_on * 1e3:.2f} ms, "
          f"ratio {m_on / m_off:.4f}")
    variants = ddp_hook_variants(a.steps // 2, a.width, max(3, a.rounds // 2))
    base = variants["no hook"]
    print("DDP comm hook alone (no timing): " + ", ".join(f"{k} {v * 1e3:.2f} ms ({v / base:.3f})"
                                                          for k, v in variants.items()))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
