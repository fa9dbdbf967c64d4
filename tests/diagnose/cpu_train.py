"""A real PyTorch training loop on CPU with a known bottleneck; writes its own truth as JSON.

    python cpu_train.py TRUTH.json --steps 200 [--ckpt-every 25 --ckpt-mb 64 --ckpt-dir D]
                        [--loader-ms 30] [--delay-rank 1 --delay-ms 40] [--eval-every 40 --eval-ms 1500]

Instrumented with `otel_gpu.training` (step, phase); telemetry goes where the OTEL_* variables
say. With WORLD_SIZE > 1 the ranks all-reduce their gradients over gloo (inside `backward`).
The truth: wall time from the first step to the end of the loop, and seconds per phase, measured
here with the same clock the user would use.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from otel_gpu import training as otg


class SlowBatches(torch.utils.data.Dataset):
    """Ready-made random batches that take `ms` each to produce (a slow decode, a slow filesystem)."""

    def __init__(self, n: int, batch: int, ms: float):
        self.n, self.batch, self.ms = n, batch, ms
        self.x, self.y = torch.randn(n * batch, 256), torch.randn(n * batch, 16)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.ms:
            time.sleep(self.ms / 1000)
        b = slice(i * self.batch, (i + 1) * self.batch)
        return self.x[b], self.y[b]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("truth")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--ckpt-mb", type=float, default=64)
    ap.add_argument("--ckpt-dir", default=".")
    ap.add_argument("--loader-ms", type=float, default=0.0, help="per batch")
    ap.add_argument("--min-step-ms", type=float, default=0.0, help="pad each step to this (a GPU's compute time)")
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-ms", type=float, default=1000.0, help="forward passes without gradients for this long")
    ap.add_argument("--delay-rank", type=int, default=-1)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    h = a.hidden
    model = torch.nn.Sequential(torch.nn.Linear(256, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
                                torch.nn.ReLU(), torch.nn.Linear(h, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowBatches(a.steps, a.batch, a.loader_ms), batch_size=None)
    blob = torch.zeros(int(a.ckpt_mb * 2**20 / 4)) if a.ckpt_every else None
    seconds = {"data_wait": 0.0, "checkpoint": 0.0, "delay": 0.0, "eval": 0.0}
    with otg.phase("setup"):      # telemetry starts here, as it would long before a real job's loop
        if world > 1:
            dist.barrier()
    it = iter(loader)
    t_start, unix_start = time.perf_counter(), time.time()
    for step in range(a.steps):
        with otg.step(samples=a.batch):
            t = t_step = time.perf_counter()
            with otg.phase("data_wait"):
                x, y = next(it)
            seconds["data_wait"] += time.perf_counter() - t
            with otg.phase("forward"):
                if rank == a.delay_rank and a.delay_ms:
                    t = time.perf_counter()
                    time.sleep(a.delay_ms / 1000)      # a slower GPU, a noisy neighbour
                    seconds["delay"] += time.perf_counter() - t
                loss = torch.nn.functional.mse_loss(model(x), y)
                pad = a.min_step_ms / 1000 - (time.perf_counter() - t_step)
                if pad > 0:
                    time.sleep(pad)
            with otg.phase("backward"):
                loss.backward()
                if world > 1:
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
            with otg.phase("optimizer"):
                opt.step()
                opt.zero_grad()
        if a.eval_every and (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
            t = time.perf_counter()
            with otg.phase("eval"), torch.no_grad():
                while time.perf_counter() - t < a.eval_ms / 1000:
                    model(x)
            seconds["eval"] += time.perf_counter() - t
        if a.ckpt_every and (step + 1) % a.ckpt_every == 0 and step + 1 < a.steps:
            t = time.perf_counter()
            with otg.checkpoint():
                path = os.path.join(a.ckpt_dir, f"ckpt-r{rank}.pt")
                with open(path, "wb") as fh:
                    torch.save({"model": model.state_dict(), "blob": blob}, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
            seconds["checkpoint"] += time.perf_counter() - t
    wall = time.perf_counter() - t_start
    if world > 1:
        dist.destroy_process_group()
    otg.shutdown()
    with open(a.truth, "w") as fh:
        json.dump({"rank": rank, "wall_s": wall, "unix_start": unix_start, "unix_end": unix_start + wall, **{f"{k}_s": v for k, v in seconds.items()},
                   **{f"{k}_share": v / wall for k, v in seconds.items()}}, fh)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
