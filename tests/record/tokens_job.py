"""A plain training loop that counts its own tokens: steps of ~40 ms, 512 tokens each, for SECONDS.

    python tokens_job.py SECONDS
"""
import sys
import time

from otel_gpu import training

seconds = float(sys.argv[1])
t0 = time.monotonic()
steps = 0
while time.monotonic() - t0 < seconds:
    with training.step(samples=4, tokens=512):
        time.sleep(0.04)
    steps += 1
print(f"finished {steps} steps", flush=True)
