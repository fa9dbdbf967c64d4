"""One NCCL rank (world size 1): the Flight Recorder sequence numbers its session exports for the stall
rule. Prints JSON: the sink's "group|state" -> sequence number after the steps' all-reduces; the same
while one more all-reduce waits behind a long kernel on the stream (queued, so not started), the raw
state and fields of that record; and after the stream has run it."""
import json
import sys
import time

import torch
import torch.distributed as dist

from otel_gpu import training as otg
from otel_gpu.training import flight_recorder as fr
from otel_gpu.training import gpu_collectives, session

steps = int(sys.argv[1])
dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
for _ in range(steps):
    with otg.step():
        dist.all_reduce(x)
        torch.cuda.synchronize()
sink = session.current().sink
dump = gpu_collectives._poller[0].dump
how = gpu_collectives.find_dump(torch._C._distributed_c10d)[1]
gpu_collectives.stop()   # its last poll; the polls below are made here, one at a time
seqs = lambda: {f"{g}|{st}": v for (g, st), v in sink.collective_seqs.items()}   # noqa: E731
after_steps = seqs()
poller = gpu_collectives.Poller(dump, sink, lambda: 0)
torch.cuda._sleep(int(3e9))    # about 1.5-2 s of one spinning block on the current stream
dist.all_reduce(x)             # the NCCL stream waits for it: scheduled, not started
time.sleep(0.3)
raw = dump()
entry = json.loads(raw)["entries"][-1]
poller.poll_once()
while_queued = seqs()
torch.cuda.synchronize()
deadline = time.time() + 10
while time.time() < deadline:
    poller.poll_once()
    if fr.parse(dump())[1][-1].state == "completed":
        break
    time.sleep(0.2)
print(json.dumps({"after_steps": after_steps, "while_queued": while_queued, "final": seqs(),
                  "queued_entry": {k: entry.get(k) for k in ("record_id", "collective_seq_id", "state", "process_group",
                                                             "is_p2p", "profiling_name", "retired")},
                  "fields": sorted(entry), "dump": how}))
dist.destroy_process_group()
