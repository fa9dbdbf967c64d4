"""A 2-rank DDP job (gloo, CPU) that runs clean, then meets a problem at a time it picks itself.

    torchrun --nproc_per_node 2 onset_train.py --problem straggler --rank 1 --onset 25 --seconds 90 --truth F

No otel-gpu code. Problems, from `--onset` seconds after the first step on:
  straggler   rank R computes --extra-ms longer every step (its own busy time)
  input       every rank's loader takes --extra-ms longer per batch
  checkpoint  rank R saves a checkpoint (torch.save of ~--ckpt-mb MB, fsync'd) every --every steps
  hang        rank R stops before its next collective (sleeps) while the other rank blocks in it
  clean       nothing
Each rank appends its truth to --truth as one JSON line when the problem starts for it: the onset
time (unix s), its step number then, and for checkpoints every save's measured start and end.
"""
import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--problem", choices=("clean", "straggler", "input", "checkpoint", "hang"), default="clean")
p.add_argument("--rank", type=int, default=1)
p.add_argument("--onset", type=float, default=25.0)
p.add_argument("--seconds", type=float, default=90.0)
p.add_argument("--extra-ms", type=float, default=15.0)
p.add_argument("--ckpt-mb", type=float, default=40.0)
p.add_argument("--every", type=int, default=15)
p.add_argument("--truth", required=True)
a = p.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo")
rank = dist.get_rank()


class DeviceWait(torch.nn.Module):
    """Stands in for the GPU time a host waits for (a CUDA job's host sits in a synchronize): the
    ranks leave the CPU to others, as GPU jobs do, so two ranks fit a small machine."""

    def forward(self, x):
        time.sleep(0.025)
        return x


model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), DeviceWait(), torch.nn.Linear(256, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
started = {"t": None}


def late() -> bool:
    return started["t"] is not None and time.time() - started["t"] >= a.onset


class Batches(torch.utils.data.IterableDataset):
    pool = [(torch.randn(1024, 64), torch.randn(1024, 64)) for _ in range(8)]   # loading costs ~nothing

    def __iter__(self):
        i = 0
        while True:
            if a.problem == "input" and late():
                time.sleep(a.extra_ms / 1000)
            i += 1
            yield self.pool[i % len(self.pool)]


def truth(**extra) -> None:
    with open(a.truth, "a") as f:
        f.write(json.dumps({"problem": a.problem, "rank": rank, **extra}) + "\n")


ckpt_dir = tempfile.mkdtemp(prefix="onset-ckpt-")
said = False
saves = []
for step, (x, y) in enumerate(torch.utils.data.DataLoader(Batches(), batch_size=None)):
    if started["t"] is None:
        started["t"] = time.time()
    if late() and not said and (a.problem in ("input", "clean") or rank == a.rank):
        said = True
        truth(onset_t=time.time(), step=step)
    if a.problem == "hang" and said:
        time.sleep(3600)   # never reaches the all-reduce below: the other rank waits in it
    if a.problem == "straggler" and said:
        time.sleep(a.extra_ms / 1000)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    if a.problem == "checkpoint" and said and step % a.every == 0:
        t0 = time.time()
        path = os.path.join(ckpt_dir, "ckpt.pt")
        torch.save({"model": model.state_dict(), "ballast": torch.zeros(int(a.ckpt_mb * 262144))}, path)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        saves.append((t0, time.time()))
    if step % 10 == 9:   # both ranks stop after the same step: each rank's own clock could differ by one
        stop = torch.tensor([float(time.time() - started["t"] >= a.seconds)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
if saves:
    truth(saves=saves)
dist.barrier()
dist.destroy_process_group()
