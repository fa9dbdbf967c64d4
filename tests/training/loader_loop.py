"""A plain PyTorch loop over a DataLoader with no otel-gpu code; it measures itself.

    python loader_loop.py STEPS OUT.json [FORWARD_SLEEP_S] [CKPT_EVERY] [CKPT_SLEEP_S] [CKPT_PATH]

Each step: `next()` on the DataLoader iterator (timed by the script as its data wait), the model
call (a module tree: Sequential of Linear/ReLU blocks plus a loss module; FORWARD_SLEEP_S seconds
of host time inside the model's forward, so forward is known), backward, optimizer step. Every
CKPT_EVERY steps a `torch.save` into a file whose first write takes CKPT_SLEEP_S (a slow
filesystem). Writes per step the data wait, forward and step seconds, and the unix start/end of
every save, to OUT.json.
"""
import io
import json
import sys
import time

import torch


class Slow(torch.nn.Module):
    """A block whose forward takes at least `sleep_s` of host time."""

    def __init__(self, sleep_s: float):
        super().__init__()
        self.sleep_s = sleep_s
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))

    def forward(self, x):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.body(x)


class SlowFile(io.FileIO):
    """A file on a slow filesystem: the first write waits `delay_s`."""

    def __init__(self, path: str, delay_s: float):
        super().__init__(path, "wb")
        self.delay_s = delay_s

    def write(self, b):
        if self.delay_s:
            time.sleep(self.delay_s)
            self.delay_s = 0.0
        return super().write(b)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.randn(16), torch.randn(2)


def main(steps: int, out: str, forward_s: float, ckpt_every: int, ckpt_s: float, ckpt_path: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(Slow(forward_s), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    loss_fn = torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(torch.utils.data.DataLoader(Data(), batch_size=8))
    rows, saves = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        out_ = model(x)
        t2 = time.perf_counter()
        loss_fn(out_, y).backward()
        opt.step()
        opt.zero_grad()
        t3 = time.perf_counter()
        rows.append({"data_wait": t1 - t0, "forward": t2 - t1, "step": t3 - t0})
        if ckpt_every and (i + 1) % ckpt_every == 0:
            start = time.time()
            with SlowFile(ckpt_path, ckpt_s) as f:
                torch.save(model.state_dict(), f)
            saves.append([start, time.time()])
    with open(out, "w") as f:
        json.dump({"steps": rows, "saves": saves}, f)
    print("finished", flush=True)


if __name__ == "__main__":
    a = sys.argv
    main(int(a[1]), a[2], float(a[3]) if len(a) > 3 else 0.0, int(a[4]) if len(a) > 4 else 0,
         float(a[5]) if len(a) > 5 else 0.0, a[6] if len(a) > 6 else "/dev/null")
