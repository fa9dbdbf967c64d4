"""A process's distributed-training rank, read from its environment.

`/proc/<pid>/environ` is a NUL-separated list of `KEY=VALUE` entries as they were
when the process started (later `os.environ` changes in the process do not show).
"""
from __future__ import annotations

import os

from .procfields import read_text

# Looked up in this order: torchrun/DeepSpeed, Open MPI, MPICH/Intel MPI, Slurm.
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


def parse_environ(data: bytes) -> dict[str, str]:
    """Parse NUL-separated `KEY=VALUE` bytes into a dict (undecodable bytes replaced)."""
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def rank_from_env(env: dict[str, str]) -> str | None:
    """The first non-empty rank variable of `RANK_VARIABLES`, or None."""
    for var in RANK_VARIABLES:
        value = env.get(var, "").strip()
        if value:
            return value
    return None


def read_environ(pid: int, proc_root: str = "/proc") -> dict[str, str] | None:
    """The environment of `pid`, or None when it is gone or not ours to read."""
    try:   # bounded: at most procfields.MAX_READ bytes (EFBIG beyond)
        return parse_environ(read_text(os.path.join(proc_root, str(pid), "environ")).encode("utf-8", "surrogateescape"))
    except OSError:  # gone, not ours to read, ESRCH while the process exits, too large
        return None


def rank_of(pid: int, proc_root: str = "/proc") -> str | None:
    """The rank of process `pid` (`RANK`, else `OMPI_COMM_WORLD_RANK`, `PMI_RANK`,
    `SLURM_PROCID`), or None when unset, the process is gone, or permission is denied."""
    env = read_environ(pid, proc_root)
    return rank_from_env(env) if env is not None else None
