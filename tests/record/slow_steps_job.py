"""A user's training loop with periodic slow steps: every PERIOD-th step (counted from OFFSET) waits
SLOW seconds more, in the data pipeline or in the loss computation (WHERE), as a cache refill or a
logging hook would. It writes the wall time of each step, from one optimizer.step() return to the
next, as JSON to OUT: the truth a report's median is checked against.

    python slow_steps_job.py OUT STEPS PERIOD OFFSET SLOW WHERE(data|loss)
"""
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, IterableDataset

out, steps, period, offset, slow, where = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    float(sys.argv[5]), sys.argv[6]


class Batches(IterableDataset):
    def __iter__(self):
        for i in range(steps + 1):
            if where == "data" and i % period == offset:
                time.sleep(slow)
            yield torch.randn(32, 64), torch.randn(32, 1)


model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ends = []
for i, (x, y) in enumerate(DataLoader(Batches(), batch_size=None)):
    if i == steps:
        break
    loss = torch.nn.functional.mse_loss(model(x), y)
    if where == "loss" and i % period == offset:
        time.sleep(slow)
    time.sleep(0.02)              # the rest of a real step's work
    loss.backward()
    opt.step()
    opt.zero_grad()
    ends.append(time.time())
with open(out, "w") as f:
    json.dump([b - a for a, b in zip(ends, ends[1:])], f)
