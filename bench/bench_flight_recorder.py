"""Cost of GPU-timed collective measurement (the Flight Recorder poller), side by side with it off.

On this CPU machine the poller reads gloo's Flight Recorder (torch >= 2.10 records gloo collectives in
the generic recorder, same format as NCCL's, without durations) through the same control-plane handler
path it uses for NCCL (`fr_trace_json` here, `dump_nccl_trace_json` there). A world-size-1 gloo loop
runs steps of --collectives all-reduces plus --compute-ms of Python-held compute (the GIL-bound part
of a real step), with the poller off and on, in interleaved rounds; it prints the median step time
of each and their ratio, the cost of one poll (dump without the GIL + decode with it) for a full ring,
that cost per collective, and the longest the training thread was kept off the GIL during polls.

    python bench/bench_flight_recorder.py [--rounds 5] [--steps 30] [--collectives 64] [--ring 2000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--collectives", type=int, default=64)
    ap.add_argument("--compute-ms", type=float, default=40.0)
    ap.add_argument("--ring", type=int, default=2000)
    ap.add_argument("--interval", type=float, default=1.0, help="poll interval, s (the product's default)")
    a = ap.parse_args()
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(a.ring)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29581")
    import torch
    import torch.distributed as dist
    import torch._C._distributed_c10d as c10d

    from otel_gpu.training import flight_recorder as fr
    from otel_gpu.training import gpu_collectives as gc

    dist.init_process_group("gloo", rank=0, world_size=1)
    dump = gc.handler_dump(c10d, "fr_trace_json")
    if dump is None:
        print("this torch has no generic Flight Recorder handler (torch < 2.10): nothing to measure")
        return 1
    x = torch.ones(256)
    for _ in range(a.ring):   # a full ring, as a long run has
        dist.all_reduce(x)

    class Sink:
        def collective_gpu(self, *args):
            pass

        def unmeasured(self, reason, n):
            pass

    def step():
        for _ in range(a.collectives):
            dist.all_reduce(x)
        t = time.perf_counter() + a.compute_ms / 1e3
        while time.perf_counter() < t:   # Python-held work: feels every GIL hold of the poller
            pass

    def run(polling: bool) -> list[float]:
        poller = gc.Poller(dump, Sink(), lambda: 0, interval_s=a.interval).start() if polling else None
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        if poller is not None:
            poller.stop(final_poll=False)
        return times

    off, on = [], []
    for _ in range(a.rounds):
        off += run(False)
        on += run(True)
    # one poll of a full ring: the dump (GIL released) and the decode (GIL held), and the GIL gaps it causes
    polls, decode = [], []
    cursor = fr.Cursor()
    cursor.update(fr.parse(dump())[1])
    for _ in range(20):   # steady state: the ring is full and holds one second of new collectives at most
        t0 = time.perf_counter()
        text = dump()
        t1 = time.perf_counter()
        cursor.update(fr.parse(text, min_id=cursor.next_id)[1])
        polls.append(time.perf_counter() - t0)
        decode.append(time.perf_counter() - t1)
    gaps, stop = [], threading.Event()

    def poll_loop():
        while not stop.is_set():
            cursor.update(fr.parse(dump(), min_id=cursor.next_id)[1])
    th = threading.Thread(target=poll_loop)
    th.start()
    last = time.perf_counter()
    end = last + 2.0
    while last < end:
        time.sleep(0.0005)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    stop.set()
    th.join()
    m_off, m_on = statistics.median(off), statistics.median(on)
    poll = statistics.median(polls)
    print(f"torch {torch.__version__}, gloo world size 1, ring {a.ring} entries, poll every {a.interval:g} s")
    print(f"step ({a.collectives} all-reduces + {a.compute_ms:g} ms compute), median of {len(off)}: "
          f"off {m_off * 1e3:.2f} ms, on {m_on * 1e3:.2f} ms, on/off {m_on / m_off:.4f}")
    print(f"one poll of a full ring: {poll * 1e3:.2f} ms (decode with the GIL {statistics.median(decode) * 1e3:.2f} ms), "
          f"{poll / a.ring * 1e6:.2f} us per collective; at one poll per {a.interval:g} s: "
          f"{poll / a.interval * 100:.2f} % of one core")
    gaps.sort()
    print(f"training thread's 0.5 ms ticks while polling back to back: p99 gap {gaps[int(0.99 * len(gaps))] * 1e3:.2f} ms, "
          f"max {gaps[-1] * 1e3:.2f} ms")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
