"""A small 2-rank gloo training script with no otel-gpu code, for trace captures.

    torchrun --nproc_per_node 2 gloo_job.py MAX_STEPS [STOP_FILE]

Trains until MAX_STEPS optimizer steps, or until STOP_FILE exists (rank 0 looks; every rank stops
at the same step), sleeping 20 ms a step.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

max_steps = int(sys.argv[1])
stop_file = sys.argv[2] if len(sys.argv) > 2 else None
torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(max_steps):
    x, y = torch.randn(16, 64), torch.randn(16, 8)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
    if stop_file is not None:
        stop = torch.tensor([float(dist.get_rank() == 0 and os.path.exists(stop_file))])
        dist.all_reduce(stop)
        if stop.item():
            break
dist.barrier()
dist.destroy_process_group()
