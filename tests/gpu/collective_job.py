"""One rank (world size 1) all-reducing inside otel_gpu.training steps on `sys.argv[1]` (gloo or nccl);
prints, as JSON, the collective time this process would export ("kind|phase|basis|group": seconds),
the collectives not measured by reason, and, with `--profile`, the GPU time of everything the GPU ran
during the same steps in a PyTorch profiler trace (seconds; only the collectives run there) with the
names of what ran.

With one rank NCCL launches nothing for an in-place sum (an out-of-place one is a device copy): the
profiler then finds no kernel while the Flight Recorder still times its start and end events (the host's
launch latency, ~15 us a call). On NCCL the all-reduce therefore averages (ncclAvg on floats is a
pre-multiplied sum, which NCCL runs as a kernel even on one rank: `oneRankReduce`, a name without
"nccl"), over 512 MiB so that each call's kernel (~0.2-0.3 ms on an H100/H200) dwarfs that latency."""
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from otel_gpu import training as otg
from otel_gpu.training import gpu_collectives, session

backend = sys.argv[1]
profile = "--profile" in sys.argv
dist.init_process_group(backend, rank=0, world_size=1)
device = "cuda" if backend == "nccl" else "cpu"
op = dist.ReduceOp.AVG if backend == "nccl" else dist.ReduceOp.SUM   # gloo has no AVG
x = torch.ones(1 << 27 if device == "cuda" else 1 << 20, device=device)
dist.all_reduce(x, op=op)   # set-up, before the first step: not counted
prof = None
if profile:
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    prof.__enter__()
for _ in range(20):
    with otg.step():
        dist.all_reduce(x, op=op)
        work = dist.all_reduce(x, op=op, async_op=True)
        work.wait()
        if device == "cuda":
            torch.cuda.synchronize()
gpu_s, gpu_ops = None, None
if prof is not None:
    prof.__exit__(None, None, None)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    gpu_s = sum(float(e.get("dur", 0)) for e in gpu) / 1e6
    gpu_ops = {}
    for e in gpu:
        gpu_ops[e.get("name", "?")[:80]] = gpu_ops.get(e.get("name", "?")[:80], 0) + 1
gpu_collectives.stop()   # the last poll
sink = session.current().sink
print(json.dumps({"time": {"|".join(k): v for k, v in sink.collective_s.items()}, "unmeasured": sink.unmeasured_n,
                  "steps": sink.steps, "gpu_s": gpu_s, "gpu_ops": gpu_ops}))
dist.destroy_process_group()
