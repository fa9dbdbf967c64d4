"""One rank (world size 1) all-reducing inside otel_gpu.training steps on `sys.argv[1]` (gloo or nccl);
prints the collective wait this process would export, as JSON."""
import json
import sys

import torch
import torch.distributed as dist

from otel_gpu import training as otg
from otel_gpu.training import session

backend = sys.argv[1]
dist.init_process_group(backend, rank=0, world_size=1)
device = "cuda" if backend == "nccl" else "cpu"
x = torch.ones(1 << 20, device=device)
for _ in range(5):
    with otg.step():
        dist.all_reduce(x)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
if device == "cuda":
    torch.cuda.synchronize()
sink = session.current().sink
print(json.dumps({f"{k}|{p}": v for (k, p), v in sink.collective_s.items()}))
dist.destroy_process_group()
