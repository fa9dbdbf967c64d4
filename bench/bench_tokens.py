"""Host cost per step of counting a batch's tokens (and the FLOPs basis) at the DataLoader's fetch.

Times `torch_hooks._count` (the mask's sum on the host, the sink's two additions) on batches of the
shapes given, median of rounds, beside a step time to give the ratio; and once, the exporter-thread
cost of the model's shape (`flops.model_shape`, read at the first export) for a GPT-2-style model.

    python bench/bench_tokens.py [--rounds 9] [--calls 5000] [--step-ms 300]
"""
from __future__ import annotations

import argparse
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


def per_call_us(batch, calls: int, rounds: int) -> float:
    t = types.SimpleNamespace(broken=False, sink=Sink())
    it = types.SimpleNamespace()
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            torch_hooks._count(t, it, batch)
        out.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(out)


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
        us = per_call_us(batch, a.calls if b * s < 100_000 else a.calls // 10, a.rounds)
        print(f"batch {b}x{s} with mask: {us:.2f} us per step ({us / (a.step_ms * 1000):.1e} of a {a.step_ms:g} ms step)")
    ids = torch.zeros(8, 2048, dtype=torch.long)
    us = per_call_us({"input_ids": ids}, a.calls, a.rounds)
    print(f"batch 8x2048 ids only: {us:.2f} us per step")
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12))
    start = time.perf_counter()
    flops.model_shape(model)
    print(f"model shape of GPT-2 124M (once, exporter thread): {(time.perf_counter() - start) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
