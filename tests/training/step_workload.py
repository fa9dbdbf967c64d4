"""Fixed-length steps (sleep + a little compute) timed in-process; prints step times as JSON."""
import json
import sys
import time

from otel_gpu import training as otg


def main(steps: int, step_s: float):
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        with otg.step(samples=1):
            with otg.phase("forward"):
                sum(i * i for i in range(2000))
            with otg.phase("backward"):
                time.sleep(step_s)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    otg.shutdown()
    print(json.dumps({"steps": times, "shutdown_s": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
