"""A small DDP training script with no otel-gpu code in which one rank stops before a collective mid-run.

    torchrun --nproc_per_node 2 hang_job.py STOP_RANK STOP_STEP TRUTH_FILE

gloo, CPU. Every rank trains; at step STOP_STEP (counted from 0) rank STOP_RANK writes the truth as
JSON to TRUTH_FILE (its rank, the step, the unix time, its PID) and sleeps for an hour in
`stopped_before_the_collective` instead of running the step; the other rank runs the step and blocks
in its DDP gradient all-reduce. Whoever started the job kills it.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

stop_rank, stop_step, truth = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


def stopped_before_the_collective(step: int) -> None:
    with open(truth + ".tmp", "w") as f:
        json.dump({"rank": dist.get_rank(), "step": step, "t": time.time(), "pid": os.getpid()}, f)
    os.replace(truth + ".tmp", truth)
    time.sleep(3600)


torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n = stop_step + 100
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(n * 16, 64), torch.randn(n * 16, 8)),
                                   batch_size=16)
for i, (x, y) in enumerate(data):
    if i == stop_step and dist.get_rank() == stop_rank:
        stopped_before_the_collective(i)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
dist.destroy_process_group()
