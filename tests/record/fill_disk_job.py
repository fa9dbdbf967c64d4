"""A plain PyTorch loop (no otel-gpu code) during which the disk fills up: after some steps it writes
a file into FOLDER until the file system has no space left, then trains on and exits with STATUS.

    python fill_disk_job.py FOLDER STATUS
"""
import errno
import os
import sys
import time

import torch

folder, status = sys.argv[1], int(sys.argv[2])
model = torch.nn.Linear(16, 2)
opt = torch.optim.Adam(model.parameters())


def train(steps: int) -> None:
    for _ in range(steps):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)


train(150)
fd = os.open(os.path.join(folder, "ballast"), os.O_WRONLY | os.O_CREAT)
filled = 0
try:
    while True:
        filled += os.write(fd, b"\0" * 4096)
except OSError as exc:
    if exc.errno != errno.ENOSPC:
        raise
os.close(fd)
print(f"filled {filled} bytes: the disk is full", flush=True)
train(300)   # ~3 s of exports into a full disk
print("finished", flush=True)
sys.exit(status)
