"""Run a function over many items in forked worker processes (one per core), results in item order.

The items and the function are left in a module global before the pool forks, so the workers see
the parent's memory (copy-on-write: the trace arrays are never pickled); only each item's result
comes back. Where fork is not available, or there is one core or a single item, everything runs
in this process: the results are the same either way.
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import os
from contextlib import contextmanager
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")
_shared: dict = {}  # what forked workers read (set before the pool forks)


def default_jobs() -> int:
    """Worker processes to use: the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return os.cpu_count() or 1


def fork_map(fn: Callable[[T], R], items: Sequence[T], jobs: int | None = None,
             post: Callable[[R], R] | None = None) -> list[R]:
    """``[post(fn(x)) for x in items]``, ``fn`` computed by up to ``jobs`` forked workers (default:
    one per core), ``post`` (optional) in this process as each result arrives."""
    jobs = min(len(items), jobs or default_jobs())
    post = post or _same
    if jobs <= 1 or "fork" not in mp.get_all_start_methods() or _shared:
        return [post(fn(x)) for x in items]  # (a worker never forks workers of its own)
    _shared["call"] = (fn, items)
    try:
        from concurrent.futures import ProcessPoolExecutor   # (here: 0.7 MB the set_workers path never needs)
        with frozen_heap(), ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
            # small chunks: ranks differ in size, and the last ones should not wait on one worker
            return [post(r) for r in pool.map(_call, range(len(items)), chunksize=max(1, len(items) // (4 * jobs)))]
    finally:
        _shared.clear()


@contextmanager
def frozen_heap():
    """The objects that exist now left out of garbage collection while the block runs (gc.freeze):
    a forked worker's full collections then do not walk, and so copy, the parent's whole heap."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _same(x):
    return x


def _call(i: int):
    fn, items = _shared["call"]
    return fn(items[i])
