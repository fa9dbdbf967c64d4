"""Lifetime of the processes otel-gpu starts: each ends when the otel-gpu command that started it ends.

Linux mechanisms, each usable alone:
- death signal: `popen(..., death_signal=SIGTERM)` asks the kernel (prctl PR_SET_PDEATHSIG, set
  in the child between fork and exec) to send that signal to the child when the thread that
  started it exits. Start children from the main thread: then it fires when we exit, even by
  SIGKILL. It is not inherited by the child's own children.
- subreaper: while `subreaper()` is held (prctl PR_SET_CHILD_SUBREAPER), a descendant whose parent
  exits (a daemon that double-forked or called setsid) is re-parented to us, not to init, so
  `Tracker` still finds it below us in /proc.
- sweep: `Tracker` lists the descendants that appeared since it was made; `end()` sends them
  SIGTERM, then SIGKILL after a grace period; `Tracker.reap_orphans` collects the exit of those
  re-parented to us (the ones no Popen waits on).
- signals: `SignalLatch` takes SIGINT, SIGTERM and SIGHUP from the first instant, so a signal that
  arrives while children are being started is acted on instead of killing us with them running.

Processes are named by (pid, start time in clock ticks since boot), so a reused pid is never hit.
Pure parts (`parse_stat`, `descendants`) take /proc text and tables; the rest reads `proc_root`.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
DEFAULT_GRACE_S = 10.0     # SIGTERM -> SIGKILL


class Proc(NamedTuple):
    """One /proc/<pid>/stat line: `start` in clock ticks since boot, `state` one letter (Z: zombie)."""

    pid: int
    ppid: int
    pgid: int
    state: str
    start: int


def parse_stat(pid: int, text: str) -> Proc | None:
    """A /proc/<pid>/stat line -> Proc (None when malformed). The command name may hold spaces
    and parentheses, so the fields are split after its last ')'."""
    try:
        fields = text.rsplit(")", 1)[1].split()
        return Proc(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]))
    except (IndexError, ValueError):
        return None


def read_table(proc_root: str = "/proc") -> dict[int, Proc]:
    """Every process visible under `proc_root`, by pid (processes that vanish while read are left out)."""
    table: dict[int, Proc] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, name, "stat")) as f:
                proc = parse_stat(int(name), f.read())
        except OSError:
            continue
        if proc is not None:
            table[proc.pid] = proc
    return table


def descendants(root: int, table: dict[int, Proc]) -> list[Proc]:
    """Every process below `root` in the parent links of `table` (children first), `root` excluded."""
    below: dict[int, list[Proc]] = {}
    for proc in table.values():
        below.setdefault(proc.ppid, []).append(proc)
    out, todo, seen = [], [root], {root}
    while todo:
        for child in below.get(todo.pop(), []):
            if child.pid not in seen:
                seen.add(child.pid)
                out.append(child)
                todo.append(child.pid)
    return out


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    return fn


_PRCTL = _prctl()


def set_death_signal(sig: int = signal.SIGTERM, parent: int | None = None) -> bool:
    """In this process: get `sig` when the parent's starting thread exits. With `parent` (the pid
    expected as parent), a parent already gone by now is honoured at once (`sig` sent to self)."""
    if _PRCTL is None:
        return False
    ok = _PRCTL(PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0) == 0
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return ok


def popen(args: Sequence[str] | str, death_signal: int | None = signal.SIGTERM, **kwargs) -> subprocess.Popen:
    """subprocess.Popen whose child gets `death_signal` when we die (call from the main thread)."""
    if death_signal is not None and _PRCTL is not None:
        parent, sig = os.getpid(), int(death_signal)
        kwargs["preexec_fn"] = lambda: set_death_signal(sig, parent)
    return subprocess.Popen(args, **kwargs)


@contextmanager
def subreaper() -> Iterator[bool]:
    """Orphaned descendants re-parent to this process while held (yields whether that works here)."""
    if _PRCTL is None:
        yield False
        return
    previous = ctypes.c_int(0)
    _PRCTL(PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0)
    ok = _PRCTL(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) == 0
    try:
        yield ok
    finally:
        if ok and not previous.value:
            _PRCTL(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(0), 0, 0, 0)


class Tracker:
    """The descendants of this process that appeared after the tracker was made."""

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root
        self.before = {(p.pid, p.start) for p in descendants(os.getpid(), read_table(proc_root))}

    def reap_orphans(self, keep: Iterable[int] = ()) -> None:
        """Reap our zombie children that appeared since the start (re-parented to us as subreaper),
        except `keep`: the pids of our own Popen children, whose Popen collects them."""
        me, kept = os.getpid(), set(keep)
        reap(p.pid for p in read_table(self.proc_root).values()
             if p.ppid == me and p.state == "Z" and p.pid not in kept and (p.pid, p.start) not in self.before)

    def new(self, exclude: Iterable[int] = ()) -> list[Proc]:
        """Live descendants not there at the start, without the subtrees of the pids in `exclude`."""
        table = read_table(self.proc_root)
        skip = set(exclude)
        for pid in list(skip):
            skip.update(p.pid for p in descendants(pid, table))
        return [p for p in descendants(os.getpid(), table)
                if (p.pid, p.start) not in self.before and p.pid not in skip and p.state != "Z"]


def _same(proc: Proc, proc_root: str) -> Proc | None:
    """`proc` as it is now, if it is still the same process and not a zombie."""
    try:
        with open(os.path.join(proc_root, str(proc.pid), "stat")) as f:
            now = parse_stat(proc.pid, f.read())
    except OSError:
        return None
    return now if now is not None and now.start == proc.start and now.state != "Z" else None


def _signal(procs: Iterable[Proc], sig: int, proc_root: str) -> int:
    sent = 0
    for proc in procs:
        if _same(proc, proc_root) is None:
            continue
        try:
            os.kill(proc.pid, sig)
            sent += 1
        except (ProcessLookupError, PermissionError):
            pass
    return sent


def reap(pids: Iterable[int]) -> None:
    """Collect the exit status of those of `pids` that are our exited children (never blocks)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def end(procs: Sequence[Proc], grace_s: float = DEFAULT_GRACE_S, proc_root: str = "/proc",
        poll_s: float = 0.05) -> int:
    """SIGTERM each of `procs`, SIGKILL those still alive after `grace_s` seconds; returns how many
    needed SIGKILL. A zombie counts as ended; nothing is reaped here (a Popen may still wait on
    one): `Tracker.reap_orphans` collects the re-parented ones."""
    if not procs:
        return 0
    _signal(procs, signal.SIGTERM, proc_root)
    left = _wait_gone(procs, grace_s, proc_root, poll_s)
    killed = _signal(left, signal.SIGKILL, proc_root)
    _wait_gone(left, 5.0, proc_root, poll_s)      # SIGKILLed processes take a moment to go
    return killed


def _wait_gone(procs: Sequence[Proc], timeout_s: float, proc_root: str, poll_s: float) -> list[Proc]:
    """Those of `procs` still alive (not zombies) after at most `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in procs if _same(p, proc_root) is not None]
    while left and time.monotonic() < deadline:
        time.sleep(poll_s)
        left = [p for p in left if _same(p, proc_root) is not None]
    return left


def kill_tree(pid: int, proc_root: str = "/proc") -> int:
    """SIGKILL `pid` and every process below it at once; returns how many were signalled."""
    table = read_table(proc_root)
    procs = ([table[pid]] if pid in table else []) + descendants(pid, table)
    return _signal(procs, signal.SIGKILL, proc_root)


def watch_parent(parent: int, stop: threading.Event, poll_s: float = 0.5,
                 label: str = "otel-gpu agent") -> threading.Thread:
    """Set `stop` once our parent is no longer `parent` (it ended and we were re-parented): a
    daemon thread polling every `poll_s` seconds; the second line of defence beside the death signal."""
    def loop() -> None:
        while not stop.is_set():
            if os.getppid() != parent:
                print(f"{label}: parent process {parent} is gone; stopping", file=sys.stderr, flush=True)
                stop.set()
                return
            stop.wait(poll_s)

    thread = threading.Thread(target=loop, name="otelgpu-parent-watch", daemon=True)
    thread.start()
    return thread


class SignalLatch:
    """Handlers for SIGINT, SIGTERM and SIGHUP from `__enter__` on: each signal is recorded and
    passed to `forward(signum)` once that is set (a signal already received is passed at once).
    `first_at` (monotonic seconds) is when the first SIGTERM or SIGHUP came: a grace period starts
    there. The previous handlers come back on exit. Enter from the main thread."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.first_at: float | None = None
        self.grace_signal: int | None = None
        self._forward: Callable[[int], None] | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "SignalLatch":
        for sig in TERMINATING:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if signum != signal.SIGINT and self.first_at is None:
            self.first_at, self.grace_signal = time.monotonic(), signum
        if self._forward is not None:
            self._forward(signum)

    def forward(self, to: Callable[[int], None]) -> None:
        self._forward = to
        for signum in self.received:
            to(signum)

    @property
    def stopping(self) -> int | None:
        """The first signal received (None: none yet)."""
        return self.received[0] if self.received else None
