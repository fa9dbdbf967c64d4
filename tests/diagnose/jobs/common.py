"""What the scenario jobs share: their flags, a dataset that can be slow, and the truth file.

Nothing here knows about otel-gpu: these are the pieces a user's own script would have.
"""
import argparse
import gc
import json
import os
import time

import torch

PLACES = ("before_forward", "forward_hook", "optimizer", "between_steps", "loader", "gc")


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("truth", help="where each rank writes what it measured (JSON; {rank} is replaced)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-where", choices=PLACES, default="before_forward")
    ap.add_argument("--slow-ms", type=float, default=0.0, help="extra time per step on the slow rank")
    ap.add_argument("--loader-ms", type=float, default=0.0, help="time to produce each batch, every rank")
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--ckpt-mb", type=float, default=32)
    ap.add_argument("--ckpt-dir", default=".")
    return ap.parse_args()


class Batches(torch.utils.data.Dataset):
    """Random batches that take `ms` each to produce (a slow decode, a slow filesystem)."""

    def __init__(self, n: int, batch: int, width: int, ms: float, clock: dict):
        self.n, self.ms, self.clock = n, ms, clock
        self.x, self.y = torch.randn(n, batch, width), torch.randn(n, batch, 16)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.ms:
            t = time.perf_counter()
            time.sleep(self.ms / 1000)
            self.clock["loader_sleep"] += time.perf_counter() - t
        return self.x[i], self.y[i]


class Truth:
    """Seconds this rank spent where the scenario put time, measured with the user's own clock."""

    def __init__(self, args):
        self.args = args
        self.rank = int(os.environ.get("RANK", "0"))
        self.s = {"slow": 0.0, "data_wait": 0.0, "checkpoint": 0.0, "loader_sleep": 0.0}
        self.saves = 0
        self.t0 = self.unix0 = None
        self.heap = None   # "gc": the long-lived objects a full collection walks

    def collect(self):
        """The slow rank frees memory every step with a full collection (`gc.collect()`, as many loops do
        before `torch.cuda.empty_cache()`): over the cyclic garbage its step left and a long-lived heap sized
        so that the collection takes about --slow-ms (what torch and the model hold is frozen first, so the
        pause does not depend on how long this machine takes to walk torch's objects). The time is measured
        around the call."""
        if self.heap is None:
            gc.freeze()
            self.heap = heap_for(self.args.slow_ms / 1000)
        for _ in range(1000):   # cyclic garbage: only the collector frees it
            d = {}
            d["self"] = d
        t = time.perf_counter()
        gc.collect()
        self.s["slow"] += time.perf_counter() - t

    def slow_here(self, place: str) -> bool:
        return self.rank == self.args.slow_rank and self.args.slow_where == place and self.args.slow_ms > 0

    def loader_ms(self) -> float:
        """Time to produce each batch on this rank: every rank's, or the slow rank's own."""
        return self.args.loader_ms or (self.args.slow_ms if self.slow_here("loader") else 0.0)

    def sleep(self):
        t = time.perf_counter()
        time.sleep(self.args.slow_ms / 1000)
        self.s["slow"] += time.perf_counter() - t

    def start(self):
        self.t0, self.unix0 = time.perf_counter(), time.time()

    def write(self):
        wall = time.perf_counter() - self.t0
        if self.slow_here("loader"):
            self.s["slow"] = self.s["loader_sleep"]
        out = {"rank": self.rank, "wall_s": wall, "unix_start": self.unix0, "unix_end": self.unix0 + wall,
               "saves": self.saves, "steps": self.args.steps, "slow_rank": self.args.slow_rank,
               "slow_where": self.args.slow_where if self.args.slow_ms else None,
               **{f"{k}_s": v for k, v in self.s.items()}, **{f"{k}_share": v / wall for k, v in self.s.items()}}
        with open(self.args.truth.format(rank=self.rank), "w") as fh:
            json.dump(out, fh)


def heap_for(seconds: float) -> list:
    """Long-lived lists, 20k at a time, until a full collection takes about `seconds` here (at most 4M; the
    fastest of three collections is judged, so a preempted one does not stop the heap short)."""
    heap: list = []
    while len(heap) < 4_000_000:
        heap += [[] for _ in range(20_000)]
        if min(_timed_collect() for _ in range(3)) >= seconds:
            break
    return heap


def _timed_collect() -> float:
    t = time.perf_counter()
    gc.collect()
    return time.perf_counter() - t


def log_metrics(truth, loss):
    """A user's between-steps bookkeeping; on the slow rank it is slow (a sleep, or a full GC: "gc")."""
    if truth.slow_here("between_steps"):
        truth.sleep()
    if truth.slow_here("gc"):
        truth.collect()
    return float(loss)
