"""A rank for the end-of-run push tests (run as a script under `otel-gpu run`): one step with the real
training hooks, so pyroscope-io pushes its CPU profile at exit, and a captured trace with GPU activity
(the file given, copied as a rank's capture of step 900) where `run` analyses captures."""
import os
import shutil
import sys
import time

from otel_gpu import training as otg


def main(trace: str) -> None:
    with otg.step(samples=1):
        folder = os.path.join(os.environ["OTELGPU_TRACE_DIR"], "steps-900-900")
        os.makedirs(folder, exist_ok=True)
        shutil.copy(trace, os.path.join(folder, "rank0.pt.trace.json"))
        time.sleep(0.5)   # wall-clock samples for the CPU profile
    otg.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
