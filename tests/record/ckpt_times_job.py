"""A user's training loop that saves checkpoints with torch.save at steps of its own choosing, different
on each rank (seeded by the rank), each save slow because the state it pickles is gathered as it is
written. It writes what it measured as JSON to OUT.<rank>.json: the unix start and end of every
save, and every step's span from one optimizer.step() return to the next.

    python ckpt_times_job.py OUT STEPS SAVES   (under torchrun: one independent process per rank)
"""
import json
import os
import random
import sys
import time

import torch

out, steps, saves = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank = int(os.environ.get("RANK", "0"))
rng = random.Random(1000 + rank)
lo, hi = 8, steps - 6
save_at = set()
while len(save_at) < saves:   # at least 8 steps apart, so every save is its own event
    s = rng.randint(lo, hi)
    if all(abs(s - x) >= 8 for x in save_at):
        save_at.add(s)
save_s = {s: rng.uniform(1.2, 2.0) for s in save_at}


class Gathered:
    """State gathered while it is pickled (as a sharded model's full state dict is)."""

    def __init__(self, tensors, seconds):
        self.tensors, self.seconds = tensors, seconds

    def __getstate__(self):
        time.sleep(self.seconds)
        return {"tensors": self.tensors}


torch.manual_seed(rank)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ends, spans = [], []
for i in range(steps):
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    time.sleep(0.05)                  # the rest of a real step's work
    opt.step()
    opt.zero_grad()
    ends.append(time.time())
    if i in save_at:
        a = time.time()
        torch.save(Gathered(model.state_dict(), save_s[i]), f"{out}.{rank}.pt")
        spans.append([a, time.time()])
with open(f"{out}.{rank}.json", "w") as f:
    json.dump({"rank": rank, "saves": spans, "steps": [[a, b] for a, b in zip(ends, ends[1:])]}, f)
