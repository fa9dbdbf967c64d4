"""A plain PyTorch loop with no otel-gpu code at all; exits with the status given."""
import sys
import time

import torch

model = torch.nn.Linear(16, 2)
opt = torch.optim.Adam(model.parameters())
for _ in range(int(sys.argv[1])):
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.01)
print("finished", flush=True)
sys.exit(int(sys.argv[2]))
