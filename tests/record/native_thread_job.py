"""A plain torch training loop with a native worker thread, and no otel-gpu code.

    python native_thread_job.py TRUTH_JSON SECONDS

The worker stands for the threads PyTorch runs native code in (on a GPU, the autograd engine's
`pt_autograd_N` threads doing backward): it holds a Python thread state but runs no Python frame
(a C function is its whole body: it blocks in `SimpleQueue.get` until the loop ends), and it is
named by the OS (`pthread_setname_np`), as PyTorch names its own. A CPU-only torch starts no such
thread itself (its backward runs on the calling thread), hence this one.

Writes TRUTH_JSON: the thread ids (`threading.get_ident()` values, which the profiler reports as
`thread_id`) of the threads this script runs, and the worker's OS name.
"""
import _thread
import ctypes
import json
import queue
import sys
import threading
import time

import torch

truth, seconds = sys.argv[1], float(sys.argv[2])
WORKER_NAME = b"data_feeder"
jobs: queue.SimpleQueue = queue.SimpleQueue()
worker = _thread.start_new_thread(jobs.get, ())     # runs no Python frame until the loop ends
ctypes.CDLL(None).pthread_setname_np(ctypes.c_ulong(worker), WORKER_NAME)

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 128), torch.randn(64, 8)
end = time.monotonic() + seconds
steps = 0
while time.monotonic() < end:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    steps += 1
jobs.put(None)
with open(truth, "w") as f:
    json.dump({"threads": [threading.get_ident(), worker], "worker": WORKER_NAME.decode(), "steps": steps}, f)
print("finished", steps, flush=True)
