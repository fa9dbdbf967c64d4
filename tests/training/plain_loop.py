"""A tiny PyTorch training loop instrumented by hand (run as a script by the tests)."""
import sys
import time

import torch

from otel_gpu import training as otg


def main(steps: int, ckpt_path: str, ckpt_sleep: float, data_s: float):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(steps):
        with otg.step(samples=8, tokens=8 * 16):
            with otg.phase("data_wait"):
                x, y = torch.randn(8, 32), torch.randn(8, 4)
                time.sleep(data_s)   # a slow input pipeline; also spans several exports
            with otg.phase("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with otg.phase("backward"):
                loss.backward()
            with otg.phase("optimizer"):
                opt.step()
                opt.zero_grad()
        if i == steps // 2:
            with otg.checkpoint():
                torch.save(model.state_dict(), ckpt_path)
                time.sleep(ckpt_sleep)   # a slow filesystem
    print("finished", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
