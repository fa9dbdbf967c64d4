"""Regenerate ``cpu_with_stack/rank0.json.gz``: a real PyTorch 2.13.0 (CPU) profiler trace recorded with
``with_stack=True, with_modules=True`` (Python frames and ``nn.Module`` frames around the ops) of a small
MLP's training steps (forward, backward, SGD), 3 active steps.

    pip install torch==2.13.0
    python tests/data/traces/make_stack_trace.py
"""
import gzip
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, schedule

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "rank0.json")
        with profile(activities=[ProfilerActivity.CPU], with_stack=True, with_modules=True,
                     schedule=schedule(wait=0, warmup=1, active=3),
                     on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
            for _ in range(4):
                loss = model(torch.randn(32, 64)).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
                prof.step()
        with open(raw) as fh:
            doc = json.load(fh)
    out = os.path.join(HERE, "cpu_with_stack", "rank0.json.gz")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with gzip.GzipFile(out, "wb", mtime=0) as fh:
        fh.write(json.dumps(doc).encode())


if __name__ == "__main__":
    main()
