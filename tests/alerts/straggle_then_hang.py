"""A 2-rank DDP job (gloo, CPU) with no otel-gpu code: clean, then rank 1 straggles, then rank 1 hangs.

    torchrun --nproc_per_node 2 straggle_then_hang.py --straggle-at 20 --hang-at 45 --truth F

From --straggle-at seconds after the first step, rank 1 computes --extra-ms longer every step (its own
busy time: rank 0 waits for it in DDP's all-reduce). From --hang-at, rank 1 stops before its next
step's backward (it sleeps; its process and exporter live) while rank 0 blocks in the all-reduce.
Rank 1 appends each onset to --truth as one JSON line (unix time, step) when it happens.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--straggle-at", type=float, required=True)
p.add_argument("--hang-at", type=float, required=True)
p.add_argument("--extra-ms", type=float, default=60.0)
p.add_argument("--truth", required=True)
a = p.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(256, 64), torch.randn(256, 64)) for _ in range(8)]


def truth(event: str, step: int) -> None:
    with open(a.truth, "a") as f:
        f.write(json.dumps({"event": event, "rank": rank, "t": time.time(), "step": step}) + "\n")


first = None
said = set()
step = 0
while True:
    x, y = data[step % len(data)]
    now = time.time()
    first = first or now
    if rank == 1 and now - first >= a.hang_at:
        if "hang" not in said:
            said.add("hang")
            truth("hang", step)
        time.sleep(3600)   # never reaches the all-reduce in backward: rank 0 waits in it
    if rank == 1 and now - first >= a.straggle_at:
        if "straggle" not in said:
            said.add("straggle")
            truth("straggle", step)
        time.sleep(a.extra_ms / 1000)
    time.sleep(0.03)   # the rest of a step's compute
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    step += 1
