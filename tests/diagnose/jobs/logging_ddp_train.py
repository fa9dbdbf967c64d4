"""A DDP loop whose logging averages the loss over the ranks, as a user writes it (no otel-gpu import).

    torchrun --nproc_per_node 2 logging_ddp_train.py TRUTH.json --slow-rank R [--slow-ms 40 --steps 80]

The user logs from an optimizer step hook: it formats a log line (slowly on rank `--slow-rank`: a
slow log sink) and then all-reduces the loss for a global average. The other rank reaches that
all-reduce first and waits there, inside its own logging. Each rank writes what it measured: its
time in the slow part of the logging, its time in the logging all-reduce, its wall time.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("truth")
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--slow-ms", type=float, default=40.0)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--hidden", type=int, default=512)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    s = {"slow": 0.0, "log_allreduce": 0.0}
    net = torch.nn.Sequential(torch.nn.Linear(256, a.hidden), torch.nn.ReLU(), torch.nn.Linear(a.hidden, 16))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    last = {"loss": torch.zeros(())}
    lines = []

    def log_step(optimizer, args, kwargs):
        if rank == a.slow_rank:   # a slow log sink on this rank
            t = time.perf_counter()
            time.sleep(a.slow_ms / 1000)
            s["slow"] += time.perf_counter() - t
        loss = last["loss"].detach().clone()
        t = time.perf_counter()
        dist.all_reduce(loss)
        s["log_allreduce"] += time.perf_counter() - t
        lines.append(f"loss {float(loss) / dist.get_world_size():.4f}")

    opt.register_step_post_hook(log_step)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(a.steps * 32, 256),
                                                                      torch.randn(a.steps * 32, 16)), batch_size=32)
    dist.barrier()
    t0 = time.perf_counter()
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        last["loss"] = loss
        opt.step()
        opt.zero_grad()
    wall = time.perf_counter() - t0
    with open(a.truth.format(rank=rank), "w") as fh:
        json.dump({"rank": rank, "slow_rank": a.slow_rank, "steps": a.steps, "wall_s": wall,
                   **{f"{k}_s": v for k, v in s.items()}}, fh)
    dist.destroy_process_group()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
