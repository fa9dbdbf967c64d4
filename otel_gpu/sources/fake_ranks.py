"""Which fake GPU each named training process is on, so a fake node runs the job it watches.

With fake GPUs and `--process` patterns, the agent's fake NVML lists each named process whose
environment says a local rank (`LOCAL_RANK`, else 0 when it says a global rank) on the fake GPU of that
index, as real NVML lists a rank's CUDA process on the GPU it chose. A process whose parent is listed
for the same GPU (a DataLoader worker, which holds no CUDA context) is left out. Demos and tests only:
real NVML never goes through here.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable

from .procenv import rank_from_env, read_environ
from .procfields import read_text


def _ppid(pid: int, proc_root: str) -> int | None:
    try:
        stat = read_text(os.path.join(proc_root, str(pid), "stat"))
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def local_rank(env: dict[str, str]) -> int | None:
    """The GPU index a rank's environment points at: LOCAL_RANK, else 0 for a rank without one."""
    text = env.get("LOCAL_RANK", "").strip()
    if text.isascii() and text.isdigit():   # ASCII digits only ('¹' is a digit to str.isdigit, not to int)
        return int(text)
    return 0 if rank_from_env(env) is not None else None


def placement(pids: Iterable[int], proc_root: str = "/proc") -> dict[int, list[int]]:
    """GPU index -> the PIDs on it, from the processes' environments (workers of a listed process left out)."""
    on: dict[int, int] = {}
    for pid in pids:
        env = read_environ(pid, proc_root)
        gpu = local_rank(env) if env is not None else None
        if gpu is not None:
            on[pid] = gpu
    out: dict[int, list[int]] = {}
    for pid, gpu in sorted(on.items()):
        if on.get(_ppid(pid, proc_root)) != gpu:
            out.setdefault(gpu, []).append(pid)
    return out


def adopter(pids: Callable[[], Iterable[int]], proc_root: str = "/proc") -> Callable[[int], list[int]]:
    """GPU index -> PIDs on it, for FakeNvml.adopt; the placement is read once per distinct set of PIDs."""
    last: list = [None, {}]

    def on_gpu(index: int) -> list[int]:
        now = frozenset(pids())
        if now != last[0]:
            last[0], last[1] = now, placement(now, proc_root)
        return last[1].get(index, [])
    return on_gpu
