"""Start and stop a rank's capture (the real Timer, Capture and torch.profiler) many times while other
threads enter Python: does torch's profiler crash the process?

    python bench/stress_capture_start.py [--processes 20] [--cycles 300] [--stacks 1] [--threads ff]

Runs `--processes` child processes one after the other (PYTHONFAULTHANDLER=1, so a crash prints its
stacks), each capturing one step `--cycles` times while `--threads` run beside it: `f` a thread that
starts C threads (pthread_create through ctypes) which each call into Python once, as a gloo thread
running a future's Python callback does (a new thread state each call); `b` a Python thread busy with
small torch and json work; `c` a Python thread that starts and joins short Python threads. Prints each
child's exit status and, at the end, the crashes (a child killed by a signal) over the profiler starts.
Seen with torch 2.13, Python 3.11 on a loaded 2-core machine (docs/capture.md): `--stacks 1 --threads ff`,
11 of 29 children of 300 captures died of SIGSEGV as the profiler started; `--threads bbc` (Python threads
only), none of 24; `--stacks 0 --threads bbcff`, none of 25.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(cycles: int, stacks: bool, kinds: str) -> int:
    """The captures, with the threads beside them; 0 when every capture was written."""
    import ctypes
    import json
    import shutil
    import threading

    import torch

    sys.path.insert(0, str(REPO))
    from otel_gpu.training.timing import Timer
    from otel_gpu.training.trace_capture import Capture

    torch.set_num_threads(1)
    stop = threading.Event()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    side = torch.nn.Linear(16, 16)
    callback_type = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    callback = callback_type(lambda arg: sum(range(50)) and None)   # runs on a C thread: a new thread state
    libc = ctypes.CDLL(None)
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, callback_type, ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]

    def foreign():
        while not stop.is_set():
            ids = [ctypes.c_ulong() for _ in range(4)]
            for tid in ids:
                libc.pthread_create(ctypes.byref(tid), None, callback, None)
            for tid in ids:
                libc.pthread_join(tid.value, None)

    def busy():
        while not stop.is_set():
            json.dumps({"a": list(range(50))})
            side(torch.randn(2, 16))

    def churn():
        while not stop.is_set():
            t = threading.Thread(target=sum, args=(range(100),))
            t.start()
            t.join()

    class Sink:
        def step(self, *a):
            pass

    threads = [threading.Thread(target={"f": foreign, "b": busy, "c": churn}[k]) for k in kinds]
    for t in threads:
        t.start()
    root = Path(tempfile.mkdtemp())
    (root / "ranks").mkdir()
    written = 0
    try:
        for _ in range(cycles):
            timer = Timer(Sink())
            capture = timer.step_listener = Capture(root, "0", window=(2, 2), stacks=stacks)
            for _ in range(4):
                model(torch.randn(8, 32)).sum().backward()
                timer.mark_step("optimizer")
            written += capture.flush(30) and capture.state == "written"
            shutil.rmtree(root / "steps-2-2", ignore_errors=True)
    finally:
        stop.set()
        for t in threads:   # joined before the interpreter ends: C threads must not enter a finalising one
            t.join()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{written} of {cycles} captures written", flush=True)
    return 0 if written == cycles else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=20)
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--stacks", type=int, choices=(0, 1), default=1)
    ap.add_argument("--threads", default="ff", help="f, b, c (see above), e.g. bbcff")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if set(args.threads) - set("fbc"):
        ap.error(f"--threads: {args.threads!r}: expected letters f, b, c")
    if args.child:
        return child(args.cycles, bool(args.stacks), args.threads)
    crashes, starts = 0, 0
    for n in range(1, args.processes + 1):
        proc = subprocess.run([sys.executable, __file__, "--child", "--cycles", str(args.cycles), "--stacks",
                               str(args.stacks), "--threads", args.threads], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONFAULTHANDLER="1"), timeout=900)
        started = proc.stderr.count("profiler_start")   # Kineto's own line at each start
        starts += started
        crashes += proc.returncode < 0
        tail = [line for line in proc.stderr.splitlines() if "Fatal Python error" in line]
        print(f"process {n}: exit {proc.returncode}, {started} profiler starts"
              + (f"; {tail[0]}" if tail else ""), flush=True)
    print(f"--stacks {args.stacks} --threads {args.threads}: {crashes} of {args.processes} processes killed by a "
          f"signal, over {starts} profiler starts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
