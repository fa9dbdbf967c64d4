"""A plain DDP training loop over gloo, as a user writes it (no otel-gpu import).

    torchrun --nproc_per_node 2 ddp_train.py TRUTH.json [--slow-rank 1 --slow-where optimizer --slow-ms 40]
             [--loader-ms 30] [--ckpt-every 10 --ckpt-mb 32 --ckpt-dir D]

Rank 0 saves the checkpoints (the others wait at a barrier). Each rank writes what it measured.
"""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import Batches, Truth, log_metrics, parse_args


def main():
    a = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    truth = Truth(a)
    h = a.hidden
    net = torch.nn.Sequential(torch.nn.Linear(256, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                              torch.nn.Linear(h, 16))
    if truth.slow_here("forward_hook"):
        net[2].register_forward_pre_hook(lambda module, args: truth.sleep())
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if truth.slow_here("optimizer"):
        opt.register_step_pre_hook(lambda optimizer, args, kwargs: truth.sleep())
    loader = torch.utils.data.DataLoader(Batches(a.steps, a.batch, 256, truth.loader_ms(), truth.s), batch_size=None)
    blob = torch.zeros(int(a.ckpt_mb * 2**20 / 4)) if a.ckpt_every else None
    dist.barrier()
    truth.start()
    it = iter(loader)
    for step in range(a.steps):
        t = time.perf_counter()
        x, y = next(it)
        truth.s["data_wait"] += time.perf_counter() - t
        if truth.slow_here("before_forward"):
            truth.sleep()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        log_metrics(truth, loss)
        if a.ckpt_every and (step + 1) % a.ckpt_every == 0 and step + 1 < a.steps:
            if truth.rank == 0:
                t = time.perf_counter()
                torch.save({"model": model.state_dict(), "blob": blob}, os.path.join(a.ckpt_dir, "ckpt.pt"))
                truth.s["checkpoint"] += time.perf_counter() - t
                truth.saves += 1
            dist.barrier()
    truth.write()
    dist.destroy_process_group()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
