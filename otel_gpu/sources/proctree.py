"""The processes below given ones: a job's ranks and their DataLoader workers, for the process source.

A DataLoader worker is a child of its rank and uses no GPU, so "the processes on a GPU" miss it;
`otel-gpu run` and `otel-gpu tune` start the node agent with their own pid (`--parent-pid`), and the
job is everything below that pid except otel-gpu's own helpers (the agent, the findings watcher, the
guard that ends the job's processes when run is killed).

Children come from `<proc_root>/<pid>/task/<tid>/children` (Linux with CONFIG_PROC_CHILDREN, the
usual case: a few small files per process followed, every 2 s: a DataLoader's workers are read
from their first seconds); where the kernel has none, from the parent pid field of every
`<proc_root>/<pid>/stat`. Every read is bounded.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterable

MAX_READ = 1 << 16          # bytes read of a children, stat or cmdline file
MAX_PROCESSES = 4096        # processes followed below the roots (a fork bomb does not stall a round)
# the command lines of otel-gpu's own child processes: the agent and the watcher (`-c "...from otel_gpu.cli
# import main..."`), the guard (`-m otel_gpu.tree_guard`)
OWN_HELPERS = (b"from otel_gpu.cli import main", b"-m\0otel_gpu.")


def parse_pids(data: bytes) -> set[int]:
    """The pids of a `children` file: decimal numbers separated by spaces."""
    return {int(w) for w in data.split() if w.isdigit()}


def descendants(roots: Iterable[int], children: Callable[[int], set[int]], limit: int = MAX_PROCESSES) -> set[int]:
    """Every process below `roots` (the roots left out), breadth first, at most `limit` of them."""
    out: set[int] = set()
    todo = list(roots)
    seen = set(todo)
    while todo and len(out) < limit:
        for c in children(todo.pop(0)):
            if c not in seen and len(out) < limit:
                seen.add(c)
                out.add(c)
                todo.append(c)
    return out


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_READ)
    except OSError:   # gone, or not ours to read
        return None


def children_from_tasks(pid: int, proc_root: str) -> set[int] | None:
    """Children of `pid` from its threads' `children` files; None where the kernel offers none."""
    task = os.path.join(proc_root, str(pid), "task")
    try:
        tids = os.listdir(task)
    except OSError:
        return set()   # the process is gone
    out, found = set(), False
    for tid in tids:
        data = _read(os.path.join(task, tid, "children"))
        if data is not None:
            found = True
            out |= parse_pids(data)
    return out if found else (None if tids else set())


def parents_map(proc_root: str) -> dict[int, set[int]]:
    """pid -> its children, from every process's stat file (the fallback: one pass over /proc)."""
    from ..children import read_table   # only on a kernel without children files

    out: dict[int, set[int]] = {}
    for proc in read_table(proc_root).values():
        out.setdefault(proc.ppid, set()).add(proc.pid)
    return out


def _own_helper(cmdline: bytes) -> bool:
    return any(h in cmdline for h in OWN_HELPERS)


class TreeFinder:
    """A `pids` callable: the processes below `roots()` (rescanned at most every `rescan_s`), less
    otel-gpu's own helpers below `job_root` and everything under them, less this process."""

    def __init__(self, roots: Callable[[], Iterable[int]], job_root: int | None = None, proc_root: str = "/proc",
                 rescan_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.roots, self.job_root, self.proc_root = roots, job_root, proc_root
        self.rescan_s, self.clock = rescan_s, clock
        self._found: set[int] = set()
        self._at: float | None = None

    def _children(self) -> Callable[[int], set[int]]:
        table: dict[int, set[int]] | None = None
        me = os.getpid()

        def children(pid: int) -> set[int]:
            nonlocal table
            kids = children_from_tasks(pid, self.proc_root) if table is None else None
            if kids is None:
                if table is None:
                    table = parents_map(self.proc_root)
                kids = table.get(pid, set())
            if pid == self.job_root:   # otel-gpu's own children: the agent, the watcher
                kids = {k for k in kids if k != me and not _own_helper(_read(os.path.join(
                    self.proc_root, str(k), "cmdline")) or b"")}
            return kids - {me}
        return children

    def __call__(self) -> set[int]:
        now = self.clock()
        if self._at is None or now - self._at >= self.rescan_s:
            roots = set(self.roots())
            if self.job_root is not None:
                roots.add(self.job_root)
            self._found = descendants(roots, self._children()) if roots else set()
            self._at = now
        return set(self._found)
