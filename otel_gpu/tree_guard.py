"""The guard of `otel-gpu run`'s processes: it outlives `run` and ends what `run` could not.

`run` ends its processes itself when it ends normally or by a catchable signal. When it dies
without a chance to act (SIGKILL, a crash), the kernel's death signal reaches its direct children
only, and not those that changed their credentials (the kernel clears the death signal on a setuid:
`run -- setpriv --reuid=nobody ... sleep 300` lived on). So `run` starts this small process in its
own session, with one end of a pipe: every POLL_S it notes `run`'s descendants (pid and start
time); when the pipe closes without `run` having said it is done, `run` is gone, and the guard
sends SIGTERM to each noted process and everything below it now, then SIGKILL after GRACE_S.

    python -m otel_gpu.tree_guard RUN_PID       (stdin: the pipe; `run` writes b"q" when it is done)
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

from . import children
from .words import count

POLL_S = 0.2       # how often the tree is noted: a process younger than this may be missed
GRACE_S = 2.0      # SIGTERM -> SIGKILL
DONE = b"q"


def watch(run_pid: int, fd: int = 0, proc_root: str = "/proc") -> int:
    """Note `run_pid`'s descendants until `fd` ends; then end them unless DONE came. Returns how
    many processes were ended."""
    me, noted, done = os.getpid(), set(), False
    while True:
        table = children.read_table(proc_root)
        noted = {(p.pid, p.start) for p in children.descendants(run_pid, table) if p.pid != me} or noted
        if select.select([fd], [], [], POLL_S)[0]:
            data = os.read(fd, 64)
            done = done or DONE in data
            if not data:
                break
    if done:
        return 0
    table = children.read_table(proc_root)
    roots = [p for p in table.values() if (p.pid, p.start) in noted]
    procs = {p.pid: p for root in roots for p in [root, *children.descendants(root.pid, table)]
             if p.pid != me and p.state != "Z"}
    children.end(list(procs.values()), GRACE_S, proc_root)
    return len(procs)


@contextmanager
def guarding() -> Iterator[subprocess.Popen | None]:
    """Start the guard of this process's tree for the block; tell it all is done at the end. None
    (and nothing started) where /proc cannot be read."""
    if not os.path.isdir("/proc/self"):
        yield None
        return
    read, write = os.pipe()   # both close-on-exec: no child of ours holds the write end open
    try:
        guard = subprocess.Popen([sys.executable, "-m", "otel_gpu.tree_guard", str(os.getpid())], stdin=read,
                                 stdout=subprocess.DEVNULL, start_new_session=True,
                                 env={**os.environ, "PYTHONPATH": _package_root()})
    except OSError:
        os.close(read)
        os.close(write)
        yield None
        return
    os.close(read)
    try:
        yield guard
    finally:
        try:
            os.write(write, DONE)   # it reads this and ends by itself: not waited for (run ends sooner)
        finally:
            os.close(write)


def _package_root() -> str:
    """Where otel_gpu is found (the user's PYTHONPATH, and any sitecustomize on it, is not the guard's)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):   # a terminal's signals are run's to act on
        signal.signal(sig, signal.SIG_IGN)
    ended = watch(int(argv[0]))
    if ended:
        try:
            print(f"otel-gpu run: ended {count(ended, 'process')} left by a run that was killed", file=sys.stderr,
                  flush=True)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
