"""A plain training loop of STEPS optimizer steps, no otel-gpu code: `python short_job.py STEPS`."""
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(int(sys.argv[1])):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
