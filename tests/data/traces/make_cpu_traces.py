"""Regenerate the small real CPU traces in this folder (PyTorch 2.13.0 CPU, gloo, 2 ranks).

    pip install torch==2.13.0
    python tests/data/traces/make_cpu_traces.py

Two sets, each one folder with one gzip'd Kineto trace per rank, 4 ProfilerSteps:
- ``cpu_gloo_sync_straggler``: rank 1 does 4x the matmul work (a straggler) and every
  step calls ``.item()`` 64 times (host syncs, shown as aten::item / aten::_local_scalar_dense).
- ``cpu_gloo_clean``: equal work on both ranks, no ``.item()``.
"""
import gzip
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))


def work(rank: int, world: int, out: str, straggler: bool, syncs: bool, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    w = torch.randn(256, 256)
    x = torch.randn(64, 256)
    tmp = tempfile.mkdtemp()
    sched = torch.profiler.schedule(wait=0, warmup=1, active=4, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(tmp)) as prof:
        for _ in range(6):
            reps = 4 * 8 if (straggler and rank == 1) else 8
            y = x
            for _ in range(reps):
                y = torch.tanh(y @ w)
            if syncs:
                acc = 0.0
                for i in range(64):
                    acc += y[i % y.shape[0], 0].item()
            g = y.sum(0)
            dist.all_reduce(g)
            prof.step()
    dist.destroy_process_group()
    src = max((os.path.join(tmp, f) for f in os.listdir(tmp)), key=os.path.getsize)
    with open(src, "rb") as fi, gzip.open(os.path.join(out, f"rank{rank}.pt.trace.json.gz"), "wb", 9) as fo:
        shutil.copyfileobj(fi, fo)
    shutil.rmtree(tmp)


def make(name: str, straggler: bool, syncs: bool, port: int) -> None:
    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    mp.spawn(work, args=(2, out, straggler, syncs, port), nprocs=2, join=True)


if __name__ == "__main__":
    make("cpu_gloo_sync_straggler", True, True, 29531)
    make("cpu_gloo_clean", False, False, 29532)
    print("torch", torch.__version__, file=sys.stderr)
