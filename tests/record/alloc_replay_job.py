"""A one-rank loop whose CUDA allocator answers are a recorded real `torch.cuda.memory_stats()` output
(tests/data/cuda_memory_stats), replayed at the allocator reader's boundary; it collects garbage fully once a
step, so its GC time shows too.

    python alloc_replay_job.py STATS.json STEPS TRUTH.json
"""
import gc
import json
import sys
import time

from otel_gpu import training as otg
from otel_gpu.training import session
from otel_gpu.training.allocator import AllocatorReader


class Replay:
    """`torch.cuda` as the reader sees it: initialised, one device, the recorded answer."""

    def __init__(self, stats):
        self.stats = stats

    def is_initialized(self):
        return True

    def device_count(self):
        return 1

    def memory_stats(self, device):
        return dict(self.stats)


def main():
    stats, steps, truth = json.loads(open(sys.argv[1]).read()), int(sys.argv[2]), sys.argv[3]
    gc_s = 0.0
    for i in range(steps):
        with otg.step(samples=1):
            time.sleep(0.02)
            t = time.perf_counter()
            gc.collect(2)
            gc_s += time.perf_counter() - t
        if i == 0:
            session.current().sink.allocator = AllocatorReader(Replay(stats))
    json.dump({"steps": steps, "gc_s": gc_s}, open(truth, "w"))


if __name__ == "__main__":
    main()
