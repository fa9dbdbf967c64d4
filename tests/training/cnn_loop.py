"""A plain PyTorch loop over a small CNN on image batches (no tokens); no otel-gpu code. `main` returns
its own truth: the samples it trained on and the FLOPs `FlopCounterMode` counts over each step.
"""
import json
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode


def main(steps: int, batch: int = 8) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(steps * batch, 3, 16, 16), torch.randint(0, 10, (steps * batch,)))
    samples, flops = 0, 0.0
    for images, labels in torch.utils.data.DataLoader(data, batch_size=batch):
        with FlopCounterMode(display=False) as counter:
            torch.nn.functional.cross_entropy(model(images), labels).backward()
        flops += counter.get_total_flops()
        samples += len(images)
        opt.step()
        opt.zero_grad()
    return {"samples": samples, "flops": flops, "steps": steps}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))), flush=True)
