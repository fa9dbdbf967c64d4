"""A 2-rank gloo loop with explicit collectives and no otel-gpu import: the `otel-gpu run` hooks time it.

    torchrun --standalone --nproc_per_node 2 collective_job.py --deepspeed CONFIG [--steps 30] [--lag-ms 20]

Each optimizer step: a backward pass, an all_gather of a small tensor (rank 1 arrives `--lag-ms` late,
so rank 0 waits there), an all_reduce of the gradients, then the optimizer step. The config is read
only to be a trial's command; nothing in it changes the loop.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepspeed", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lag-ms", type=float, default=20.0)
    a = ap.parse_args()
    with open(a.deepspeed) as f:
        json.load(f)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.Linear(64, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(a.steps):
        model(torch.randn(16, 64)).pow(2).mean().backward()
        if rank == 1:
            time.sleep(a.lag_ms / 1000)
        out = [torch.zeros(4) for _ in range(world)]
        dist.all_gather(out, torch.full((4,), float(rank)))
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
