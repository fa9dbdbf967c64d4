"""Torch extension builds (DeepSpeed's JIT-compiled ops) left half-done by a killed trial.

torch builds extension NAME in `<root>/NAME/` (`<root>/<python>_<accelerator>/NAME/` under the
default root), guarded by the file `lock` there: created with O_EXCL and held open by the
building process, removed when the build ends. A trial killed mid-build leaves the lock behind,
and every later process that needs the op then polls for it to vanish, forever (torch gives
no message). A lock that no process holds open is such a leftover: the tuner removes it with
the extension's build folder (its half-written objects), before the first trial and after
each one, so the next trial builds the op afresh instead of hanging.

Linux only (open descriptors are read from /proc); elsewhere nothing is found or removed.
Only processes this one can see are asked: a build in another PID namespace (another container
sharing the same extensions folder) would look like a leftover, so give each container its own
TORCH_EXTENSIONS_DIR.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

LOCK_NAME = "lock"


@dataclass(frozen=True)
class Lock:
    path: Path
    holders: tuple[int, ...]     # pids holding it open; empty: left by a process that is gone

    @property
    def stale(self) -> bool:
        return not self.holders

    def describe(self) -> str:
        who = f"held by pid {', '.join(map(str, self.holders))}" if self.holders else "held by no process"
        return f"torch extension lock {self.path} ({who})"


def extension_roots(env: Mapping[str, str], home: str | None = None) -> list[Path]:
    """Where torch builds extensions for a process with environment `env`."""
    if env.get("TORCH_EXTENSIONS_DIR"):
        return [Path(env["TORCH_EXTENSIONS_DIR"])]
    cache = env.get("XDG_CACHE_HOME") or os.path.join(home or env.get("HOME") or os.path.expanduser("~"), ".cache")
    return [Path(cache) / "torch_extensions"]


def lock_files(roots: Iterable[Path]) -> list[Path]:
    """Every `lock` one or two folders below a root (NAME/lock or BUILD/NAME/lock)."""
    found = []
    for root in roots:
        for pattern in (f"*/{LOCK_NAME}", f"*/*/{LOCK_NAME}"):
            try:
                found += [p for p in root.glob(pattern) if p.is_file()]
            except OSError:
                continue   # unreadable root: nothing of ours there
    return sorted(set(found))


def open_files(proc_root: str = "/proc") -> dict[str, list[int]]:
    """Resolved path of every file some process holds open -> pids (those whose fds can be read)."""
    held: dict[str, list[int]] = {}
    try:
        pids = [d for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return held
    for pid in pids:
        fd_dir = os.path.join(proc_root, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue   # gone, or another user's
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            held.setdefault(target, []).append(int(pid))
    return held


def find_locks(roots: Iterable[Path], proc_root: str = "/proc") -> list[Lock]:
    paths = lock_files(roots)
    if not paths:
        return []
    held = open_files(proc_root)
    return [Lock(p, tuple(sorted(held.get(str(p.resolve()), ())))) for p in paths]


def clean_stale(roots: Iterable[Path], proc_root: str = "/proc") -> list[Path]:
    """Remove every extension build folder whose lock no process holds; returns the folders."""
    removed = []
    for lock in find_locks(roots, proc_root):
        if not lock.stale:
            continue
        folder = lock.path.parent
        aside = folder.with_name(f".{folder.name}.stale-{os.getpid()}")
        try:
            os.rename(folder, aside)   # atomic: a new build starts in a fresh folder, never in this one
        except OSError:
            continue                   # gone meanwhile, or not ours to move: left as it is
        shutil.rmtree(aside, ignore_errors=True)
        removed.append(folder)
    return removed


# ---- building DeepSpeed's ops once, before the first trial -------------------------------------

_PREBUILD = """
import sys
from deepspeed.accelerator import get_accelerator
for name in sys.argv[1:]:
    builder = get_accelerator().create_op_builder(name)
    if builder is None or type(builder).__name__ == "NotImplementedBuilder":
        print(f"PREBUILD-UNKNOWN {name}", flush=True)
        sys.exit(3)
    print(f"PREBUILD-START {name}", flush=True)
    builder.load(verbose=False)
    print(f"PREBUILD-DONE {name}", flush=True)
"""


class PrebuildError(RuntimeError):
    """An op could not be built before the study (one line)."""


def prebuild_ops(names: list[str], env: Mapping[str, str], timeout_s: float, log_path: Path,
                 grace_s: float = 5.0) -> None:
    """Build DeepSpeed ops (op builder names, e.g. CPUAdamBuilder) in one child process with the
    trials' environment, so no trial is killed in the middle of a first build. A build still
    running at `timeout_s` is killed with its process group; PrebuildError says which op."""
    import subprocess
    import sys

    from .. import children
    from .trial import kill_group, read_tail

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = children.popen([sys.executable, "-c", _PREBUILD, *names], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env), start_new_session=True)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, grace_s, proc)
    finally:
        if proc.poll() is None:
            kill_group(proc.pid, grace_s, proc)
        proc.wait()
    tail = read_tail(log_path)
    started = [line.split(" ", 1)[1] for line in tail.splitlines() if line.startswith("PREBUILD-START ")]
    unknown = [line.split(" ", 1)[1] for line in tail.splitlines() if line.startswith("PREBUILD-UNKNOWN ")]
    if unknown:
        raise PrebuildError(f"--prebuild-ops: DeepSpeed has no op builder {unknown[-1]!r} for this accelerator")
    if proc.returncode != 0:
        op = started[-1] if started else "the ops"
        lines = [" ".join(x.split()) for x in tail.splitlines() if x.strip()]
        why = (f"not built within {timeout_s:g} s" if proc.returncode < 0
               else f"exit status {proc.returncode}: {lines[-1][:200] if lines else 'no output'}")
        raise PrebuildError(f"building DeepSpeed op {op} before the first trial failed ({why}); log: {log_path}")
