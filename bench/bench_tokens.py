"""Host cost per step of counting a batch's tokens (and the FLOPs basis) at the DataLoader's fetch.

Times `torch_hooks._count` (the mask's sum on the host, the sink's two additions: the FLOPs accounting
per step; the formula itself is evaluated at export) on batches of the shapes given, median of rounds,
in wall time and in the thread's CPU time (wall on a loaded machine includes preemption), beside a step
time to give the ratio; and once, the cost of the model's shape (`flops.model_shape`, read when the
model is first seen) for a GPT-2-style model.

    python bench/bench_tokens.py [--rounds 9] [--calls 5000] [--step-ms 300]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import types

import torch

from otel_gpu.training import flops, torch_hooks


class Sink:
    def __init__(self):
        self.tokens_counted = self.token_positions = 0.0

    def fetched(self, tokens, seq):
        self.tokens_counted += tokens
        self.token_positions += tokens * seq


def per_call_us(batch, calls: int, rounds: int) -> tuple[float, float]:
    """(wall, thread CPU) microseconds per call, medians over `rounds`."""
    t = types.SimpleNamespace(broken=False, sink=Sink())
    it = types.SimpleNamespace()
    wall, cpu = [], []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            torch_hooks._count(t, it, batch)
        wall.append((time.perf_counter() - start) / calls * 1e6)
        cpu.append((time.thread_time() - start_cpu) / calls * 1e6)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--step-ms", type=float, default=300.0, help="a step time to print the ratio against")
    a = ap.parse_args()
    for b, s in ((8, 2048), (4, 512), (64, 8192)):
        mask = torch.ones(b, s, dtype=torch.long)
        mask[:, s * 3 // 4:] = 0
        batch = {"input_ids": torch.zeros(b, s, dtype=torch.long), "attention_mask": mask}
        us, cpu = per_call_us(batch, a.calls if b * s < 100_000 else a.calls // 10, a.rounds)
        print(f"batch {b}x{s} with mask: {us:.2f} us per step wall, {cpu:.2f} us CPU "
              f"({us / (a.step_ms * 1000):.1e} of a {a.step_ms:g} ms step)")
    ids = torch.zeros(8, 2048, dtype=torch.long)
    us, cpu = per_call_us({"input_ids": ids}, a.calls, a.rounds)
    print(f"batch 8x2048 ids only: {us:.2f} us per step wall, {cpu:.2f} us CPU ({us / (a.step_ms * 1000):.1e} of the step)")
    images = (torch.randn(32, 3, 32, 32), torch.zeros(32, dtype=torch.long))
    us, cpu = per_call_us(images, a.calls, a.rounds)
    print(f"batch of 32 images (no tokens): {us:.2f} us per step wall, {cpu:.2f} us CPU")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12))
    start = time.perf_counter()
    flops.model_shape(model)
    print(f"model shape of GPT-2 124M (once, when the model is first seen): {(time.perf_counter() - start) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
