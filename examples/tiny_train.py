"""A tiny PyTorch training loop with no otel-gpu code: runs on any machine's CPU in ~20 s.

    otel-gpu run -- python examples/tiny_train.py

The loader takes a few milliseconds per batch (a slow decode), so the report has something to say.
"""
import time

import torch


class SlowData(torch.utils.data.Dataset):
    def __len__(self):
        return 400 * 32

    def __getitem__(self, i):
        time.sleep(0.0004)          # ~13 ms per batch of 32: the loader is the bottleneck
        return torch.randn(128), torch.randn(8)


torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step, (x, y) in enumerate(torch.utils.data.DataLoader(SlowData(), batch_size=32)):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
print(f"done: {step + 1} steps, loss {loss.item():.3f}")
