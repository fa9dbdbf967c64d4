"""A rank that computes in one function and blocks in another (run as a script by the tests)."""
import hashlib
import sys
import threading
import time

from otel_gpu import training as otg


def slow_compute(seconds):
    end = time.perf_counter() + seconds
    h = b"x"
    while time.perf_counter() < end:
        h = hashlib.sha256(h).digest()


def blocked_on_lock(lock):
    with lock:   # held by another thread: this rank waits here
        pass


def main(steps, step_s):
    lock = threading.Lock()
    for _ in range(steps):
        with otg.step(samples=1):
            with otg.phase("forward"):
                slow_compute(step_s / 2)
            lock.acquire()
            threading.Timer(step_s / 2, lock.release).start()
            with otg.phase("backward"):
                blocked_on_lock(lock)
    otg.shutdown()
    print("finished", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
