"""One rank (world size 1) all-reducing inside otel_gpu.training steps on `sys.argv[1]` (gloo or nccl);
prints, as JSON, the collective time this process would export ("kind|phase|basis|group": seconds),
the collectives not measured by reason, and, with `--profile`, the NCCL kernels' total GPU time in a
PyTorch profiler trace of the same steps (seconds)."""
import json
import sys

import torch
import torch.distributed as dist

from otel_gpu import training as otg
from otel_gpu.training import gpu_collectives, session

backend = sys.argv[1]
profile = "--profile" in sys.argv
dist.init_process_group(backend, rank=0, world_size=1)
device = "cuda" if backend == "nccl" else "cpu"
x = torch.ones(1 << 24 if device == "cuda" else 1 << 20, device=device)
dist.all_reduce(x)   # set-up, before the first step: not counted
prof = None
if profile:
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    prof.__enter__()
for _ in range(20):
    with otg.step():
        dist.all_reduce(x)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        if device == "cuda":
            torch.cuda.synchronize()
nccl_kernels_s = None
if prof is not None:
    prof.__exit__(None, None, None)
    nccl_kernels_s = sum(e.device_time_total for e in prof.key_averages() if "nccl" in e.key.lower()) / 1e6
gpu_collectives.stop()   # the last poll
sink = session.current().sink
print(json.dumps({"time": {"|".join(k): v for k, v in sink.collective_s.items()}, "unmeasured": sink.unmeasured_n,
                  "steps": sink.steps, "nccl_kernels_s": nccl_kernels_s}))
dist.destroy_process_group()
