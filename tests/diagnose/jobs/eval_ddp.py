"""A plain DDP loop over gloo that evaluates now and then, as a user writes it (no otel-gpu import).

    torchrun --nproc_per_node 2 eval_ddp.py TRUTH.json --steps 40 --eval-at 10,20,30 --eval-batches 24
             [--how eval+no_grad|inference_mode|no_grad]

After each step listed in --eval-at, every rank evaluates --eval-batches batches of a held-out set
(the loss all-reduced across ranks), the way the user asked for: `model.eval()` + `torch.no_grad()`,
`torch.inference_mode()` alone, or `torch.no_grad()` alone. Each rank writes what it measured: the
seconds from the end of its first step (the first iteration, with its one-off set-up, left out) to
the end of its last iteration, the seconds spent evaluating (from the start of each pass to its
end), their ratio, and its training steps' own mean time (evaluation excluded).
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("truth")
p.add_argument("--steps", type=int, default=40)
p.add_argument("--eval-at", default="10,20,30")
p.add_argument("--eval-batches", type=int, default=24)
p.add_argument("--how", choices=("eval+no_grad", "inference_mode", "no_grad"), default="eval+no_grad")
p.add_argument("--hidden", type=int, default=768)
a = p.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo")
rank = dist.get_rank()
eval_at = {int(x) for x in a.eval_at.split(",") if x}
h = a.hidden
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, h), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 16)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.MSELoss()
g = torch.Generator().manual_seed(rank)
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(a.steps * 32, 256, generator=g),
                                                                   torch.randn(a.steps * 32, 16, generator=g)),
                                    batch_size=32)
held_out = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(a.eval_batches * 256, 256, generator=g),
                                                                      torch.randn(a.eval_batches * 256, 16, generator=g)),
                                       batch_size=256)


def evaluate() -> float:
    """Mean held-out loss over every rank."""
    if a.how == "eval+no_grad":
        model.eval()
    ctx = torch.inference_mode if a.how == "inference_mode" else torch.no_grad
    total = torch.zeros(2)
    with ctx():
        for x, y in held_out:
            loss = loss_fn(model(x), y)
            pair = torch.stack([loss * len(x), torch.tensor(float(len(x)))])
            dist.all_reduce(pair)
            total += pair
    model.train()
    return float(total[0] / total[1])


dist.barrier()
eval_s = train_s = 0.0
evals = []
start = None   # the end of the first step: the first iteration, with its one-off set-up, is left out
for step, (x, y) in enumerate(train, 1):
    t = time.perf_counter()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if start is None:
        start = time.perf_counter()
    else:
        train_s += time.perf_counter() - t
    if step in eval_at:
        t = time.perf_counter()
        evals.append(evaluate())
        eval_s += time.perf_counter() - t
    end = time.perf_counter()
wall = end - start
with open(a.truth.format(rank=rank), "w") as fh:
    json.dump({"rank": str(rank), "steps": a.steps, "passes": len(evals), "how": a.how, "wall_s": wall,
               "eval_s": eval_s, "eval_share": eval_s / wall, "train_step_s": train_s / (a.steps - 1),
               "pid": os.getpid()}, fh)
dist.barrier()
dist.destroy_process_group()
print("finished", flush=True)
