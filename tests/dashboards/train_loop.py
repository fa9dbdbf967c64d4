"""A rank of a tiny, torch-free training loop instrumented with otel_gpu.training (run by the tests).

Each phase sleeps in its own function so wall-clock flame graphs show it; rank 1 is made
slower so straggler panels have something to show (rank 0 waits for it in an all-reduce). Usage: train_loop.py STEPS STEP_SECONDS
"""
import os
import sys
import time

from otel_gpu import training as otg
from otel_gpu.training import flops, session


def load_batch(s):
    time.sleep(s)


def forward_pass(s):
    end = time.perf_counter() + s
    x = 0
    while time.perf_counter() < end:
        x += 1


def backward_pass(s):
    time.sleep(s)


def optimizer_step(s):
    time.sleep(s)


def save_checkpoint(s):
    time.sleep(s)


def main(steps: int, step_s: float) -> None:
    slow = 1.5 if os.environ.get("RANK") == "1" else 1.0
    # what the torch hooks report for a model of 1M trained weights in bf16 (this loop has no torch), so the
    # dashboard's model-work panels are evaluated on real series too
    sess = session.current().sink
    sess._shape, sess.compute_dtype = flops.Shape(trained=1_000_000, layers=2, hidden=64), "bf16"
    for i in range(steps):
        with otg.step(samples=8, tokens=8 * 128):
            sess.fetched(8 * 128, 128)
            with otg.phase("data_wait"):
                load_batch(0.1 * step_s)
            with otg.phase("forward"):
                forward_pass(0.4 * step_s * slow)
            with otg.phase("backward"):
                backward_pass(0.4 * step_s * slow)
                wait = 0.8 * step_s * (1.5 - slow) + 0.01
                with otg.collective("all_reduce"):   # the faster rank waits for the slower one here
                    time.sleep(wait)
                # what the Flight Recorder poller adds for an NCCL rank (GPU-timed, basis "gpu"), so the
                # dashboard's NCCL panels are evaluated on real series too
                session.current().sink.collective_gpu("all_reduce", "default_pg", wait + 0.002, 1)
            with otg.phase("optimizer"):
                optimizer_step(0.1 * step_s)
        if i == steps // 2:
            with otg.checkpoint():
                save_checkpoint(2 * step_s)
    otg.shutdown()
    print("finished", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
