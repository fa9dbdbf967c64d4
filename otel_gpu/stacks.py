"""Python stacks of running ranks, on request: `faulthandler` registered on a signal in each rank.

A rank whose session starts with `OTELGPU_STACKS_DIR` set (`otel-gpu run --record` sets it to the run
directory's `stacks/`) opens `rank<R>-pid<P>.txt` there, writes one header line naming its rank, PID,
the signal and its process start time, and registers `faulthandler` to append every thread's stack
to that file when the signal comes (written by the interpreter's C handler: it works while the
rank's threads are blocked in C, the GIL held or not). `request_stacks(directory)` in another
process appends a marker line to each registered rank's file, sends the signal to that rank and
returns the files that grew; `latest(path)` is the text after the last marker.

The signal is a real-time one (`SIGRTMIN + 4`): SIGUSR1 is Slurm's and Lightning's (and often
`faulthandler`'s own in user code), SIGUSR2 submitit's; nothing we know of uses real-time signals
in a training process. A handler already there (from Python or from C) is never replaced:
registration is skipped with one log line. A signal is only sent to a PID whose start time still
matches its header (a PID reused by another process is left alone), read from /proc (Linux).
"""
from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import platform
import re
import signal
import time
from pathlib import Path
from typing import Iterable, Mapping

log = logging.getLogger("otel_gpu.training")

STACKS_DIR = "OTELGPU_STACKS_DIR"
MARKER = "--- stacks requested at "
HEADER = re.compile(r"^# otel-gpu stacks: rank (\S+) pid (\d+) signal (\d+) start (\d+)$")
HEADER_MAX = 256            # bytes read of a file's first line
LATEST_MAX = 1 << 20        # bytes read of a file's end by `latest`
MAX_FILES = 4096            # rank files looked at in one directory
_registered: list = []      # the open file faulthandler writes to (kept alive), at most one


def stack_signal() -> int:
    """The signal the ranks register: SIGRTMIN + 4 where real-time signals exist, else SIGUSR2."""
    rtmin = getattr(signal, "SIGRTMIN", None)
    return int(rtmin) + 4 if rtmin is not None else int(signal.SIGUSR2)


def start_ticks(pid: int | str = "self", proc: str = "/proc") -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None without it."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    tail = raw[raw.rfind(b")") + 2:].split()   # after "pid (comm) ": the comm may hold spaces
    try:
        return int(tail[19])
    except (IndexError, ValueError):
        return None


def _c_handler_installed(sig: int) -> bool:
    """True when the signal has a handler (or is ignored) at the C level: one a library installed
    without Python's signal module, which `signal.getsignal` does not see. False where not checkable."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64", "arm64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)   # struct sigaction: the handler is its first field here
        if libc.sigaction(ctypes.c_int(sig), None, buf) != 0:
            return False
        return ctypes.c_void_p.from_buffer(buf).value not in (None, 0)   # 0: SIG_DFL
    except (OSError, AttributeError):
        return False


def register(directory: Path, rank: str, sig: int | None = None) -> Path | None:
    """Dump every thread's stack into `directory/rank<R>-pid<P>.txt` when `sig` comes; None (with the
    reason logged) when a handler is already there or the file cannot be written. Once per process."""
    if _registered:
        return Path(_registered[0].name)
    sig = stack_signal() if sig is None else sig
    current = signal.getsignal(sig)
    if current is not signal.SIG_DFL or _c_handler_installed(sig):
        log.info("otel-gpu: stacks on request off: signal %d already has a handler (%r), left as it is", sig, current)
        return None
    safe_rank = re.sub(r"[^0-9A-Za-z_.-]", "_", rank)[:32] or "x"
    path = Path(directory) / f"rank{safe_rank}-pid{os.getpid()}.txt"
    try:
        path.write_text(f"# otel-gpu stacks: rank {safe_rank} pid {os.getpid()} signal {sig} "
                        f"start {start_ticks() or 0}\n")
        out = open(path, "a", encoding="utf-8")   # O_APPEND: the requester's markers and the dumps interleave whole
    except OSError as exc:
        log.warning("otel-gpu: stacks on request off: cannot write %s: %s", path, exc.strerror or exc)
        return None
    try:
        faulthandler.register(sig, file=out, all_threads=True, chain=False)
    except (RuntimeError, ValueError, OSError) as exc:
        out.close()
        log.warning("otel-gpu: stacks on request off: %r", exc)
        return None
    _registered.append(out)
    return path


def install(env: Mapping[str, str], rank: str) -> Path | None:
    """`register` into `$OTELGPU_STACKS_DIR` when it is set (a directory that exists); else None."""
    raw = env.get(STACKS_DIR, "").strip()
    if not raw:
        return None
    if not Path(raw).is_dir():
        log.warning("otel-gpu: stacks on request off: %s=%r is not a directory", STACKS_DIR, raw)
        return None
    return register(Path(raw), rank)


def _header(path: Path) -> tuple[str, int, int, int] | None:
    """(rank, pid, signal, start ticks) from a rank file's first line; None when it is not one."""
    try:
        with open(path, "rb") as f:
            line = f.read(HEADER_MAX).split(b"\n", 1)[0].decode("ascii", "replace")
    except OSError:
        return None
    m = HEADER.match(line)
    return (m[1], int(m[2]), int(m[3]), int(m[4])) if m else None


def request_stacks(directory: Path | str, pids: Iterable[int] | None = None, timeout_s: float = 2.0,
                   proc: str = "/proc") -> list[Path]:
    """Ask every rank registered in `directory` (those of `pids` only, when given) for its threads'
    stacks; return the files a dump was appended to within `timeout_s`, in rank order. A rank that is
    gone, or whose PID now belongs to another process, is not signalled."""
    wanted = None if pids is None else {int(p) for p in pids}
    sent: dict[Path, int] = {}
    stamp = time.time()
    files = sorted(Path(directory).glob("rank*-pid*.txt"))[:MAX_FILES]
    for path in files:
        head = _header(path)
        if head is None:
            continue
        _, pid, sig, start = head
        if (wanted is not None and pid not in wanted) or start == 0 or start_ticks(pid, proc) != start:
            continue
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"\n{MARKER}{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(stamp))} UTC ({stamp:.3f}) ---\n")
            size = path.stat().st_size
            os.kill(pid, sig)
        except (OSError, ProcessLookupError) as exc:
            log.info("otel-gpu: no stacks from pid %d: %s", pid, exc)
            continue
        sent[path] = size
    grown: dict[Path, int] = {}
    deadline = time.monotonic() + timeout_s
    while sent and time.monotonic() < deadline:
        time.sleep(0.05)
        for path, size in list(sent.items()):
            now = path.stat().st_size
            if now > size and grown.get(path) == now:   # grew and then stayed put for one poll: written
                del sent[path]
            elif now > size:
                grown[path] = now
    return sorted(grown, key=_rank_order)   # one still growing at the deadline too: what it has is shown


def _rank_order(path: Path):
    m = re.match(r"rank(\d+)-", path.name)
    return (int(m[1]) if m else 1 << 30, path.name)


def latest(path: Path | str, limit: int = LATEST_MAX) -> str:
    """The text of the last dump in a rank file: what follows its last request marker (from at most
    the file's last `limit` bytes); "" when nothing was requested yet."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - limit))
        text = f.read(limit).decode("utf-8", "replace")
    at = text.rfind(MARKER)
    if at < 0:
        return ""
    return text[text.find("\n", at) + 1:]
