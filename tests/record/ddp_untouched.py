"""A small DDP training script with no otel-gpu code: gloo, CPU, a DataLoader, an optimizer.

    torchrun --nproc_per_node 2 ddp_untouched.py STEPS EXIT_STATUS [PID_FILE]

Writes its PID to PID_FILE (rank 0) after the first step, so a test can kill it mid-run.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

steps, status = int(sys.argv[1]), int(sys.argv[2])
pid_file = sys.argv[3] if len(sys.argv) > 3 else None
torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(steps * 16, 64), torch.randn(steps * 16, 8)),
                                   batch_size=16)
for i, (x, y) in enumerate(data):
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
    if i == 0 and pid_file and dist.get_rank() == 0:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
dist.barrier()
dist.destroy_process_group()
print("finished", flush=True)
sys.exit(status)
