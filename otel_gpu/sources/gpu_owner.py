"""The job using each GPU, from its processes: who they are (cgroup path, environment) and the
GPU's series labelled with it.

A process's owner attributes come from its cgroup path (cgroup_owner.py: Slurm job and step,
Kubernetes pod UID and container id, set by slurmstepd or the kubelet) and, for what a path does not
say, from its environment (`SLURM_JOB_ID`, `SLURM_STEP_ID`, `POD_NAME`, `POD_NAMESPACE` from the
downward API, the job name as identity.py reads it). A GPU's owner is the owner of its process
using the most memory (ties: the lowest PID); a GPU with no process, or none with an owner, has
none. Its series carry that owner from the round its process is listed to the round it is not.

Cardinality: one owner per GPU (MIG device) at a time, at most `len(OWNER_ATTRIBUTES)` attributes,
each value checked (`clean`): a node exports as many series as before, relabelled when a job changes.

NVML's process lists can hold PIDs that are no process here: 0 or 2^32-1 from a mismatched driver
and binding, host PIDs not in the agent's PID namespace. `pid_problem` names why such a PID is
dropped (never exported as a process); the source counts each dropped PID once while listed.
"""
from __future__ import annotations

import os
from typing import Mapping

from .. import names as N
from ..identity import job_name
from ..readings import Reading, new_reading
from .cgroup_owner import NOBODY, CgroupOwner, parse_cgroup_file
from .procfields import read_text

PID_MAX = 1 << 22           # Linux's PID_MAX_LIMIT (4,194,304): no PID is this large
MAX_VALUE = 128             # characters of an attribute value taken from a process's environment
INVALID_PID = "process_pid_invalid"      # error.type of a PID that cannot be a process (0, 2^32-1, negative)
NOT_FOUND = "process_not_found"          # error.type of a PID not in the agent's /proc (another PID namespace)
_ENV = ((N.SLURM_JOB_ID, "SLURM_JOB_ID"), (N.SLURM_STEP_ID, "SLURM_STEP_ID"),
        (N.K8S_POD_NAME, "POD_NAME"), (N.K8S_NAMESPACE, "POD_NAMESPACE"))

Owner = tuple[tuple[str, str], ...]   # attribute items in OWNER_ATTRIBUTES order; () for nobody


def clean(value: str | None) -> str | None:
    """`value` stripped when it is 1..MAX_VALUE printable characters, else None (never a label)."""
    if value is None:
        return None
    value = value.strip()
    return value if 0 < len(value) <= MAX_VALUE and value.isprintable() else None


def owner_attributes(cg: CgroupOwner, env: Mapping[str, str] | None) -> Owner:
    """The owner attribute items of one process; the cgroup path wins over the environment (the
    path is set by slurmstepd or the kubelet, the environment by anyone)."""
    env = env or {}
    found = {N.JOB: clean(job_name(env))}
    for key, var in _ENV:
        found[key] = clean(env.get(var))
    for key, value in ((N.SLURM_JOB_ID, cg.slurm_job), (N.SLURM_STEP_ID, cg.slurm_step),
                       (N.K8S_POD_UID, cg.pod_uid), (N.CONTAINER_ID, cg.container_id)):
        if value is not None:
            found[key] = value
    if cg.slurm_job is not None and cg.slurm_step is None:
        found[N.SLURM_STEP_ID] = None   # the environment's step may be another job's
    return tuple((k, found[k]) for k in N.OWNER_ATTRIBUTES if found.get(k))


def read_cgroup_owner(pid: int, proc_root: str = "/proc") -> CgroupOwner:
    """The owner `<proc_root>/<pid>/cgroup` names (bounded read); NOBODY when it cannot be read."""
    try:
        return parse_cgroup_file(read_text(os.path.join(proc_root, str(pid), "cgroup")))
    except OSError:
        return NOBODY


def pid_problem(pid: int, proc_root: str = "/proc") -> str | None:
    """Why NVML's `pid` is no process to export (INVALID_PID, NOT_FOUND), or None."""
    if not 0 < pid < PID_MAX:
        return INVALID_PID
    if not os.path.isdir(os.path.join(proc_root, str(pid))):
        return NOT_FOUND
    return None


def pick(owners: list[tuple[float, int, Owner]]) -> Owner:
    """The owner of the process using the most memory among (memory, pid, owner) with an owner;
    ties go to the lowest PID; () when none has one."""
    best = None
    for mem, pid, owner in owners:
        if owner and (best is None or (mem, -pid) > (best[0], -best[1])):
            best = (mem, pid, owner)
    return best[2] if best is not None else ()


def with_assignment(owner: Owner, assigned: Owner | None) -> Owner:
    """A GPU's owner from its processes completed by the kubelet's assignment of the GPU: the assignment
    when no process names an owner (a pod holding an idle GPU); the processes' owner with the assignment's
    missing attributes (the container name; the pod name where the cgroup path gave only its uid) when it
    names no other pod; else the processes' owner unchanged (they are what runs on the GPU)."""
    if not assigned:
        return owner
    if not owner:
        return assigned
    mine, theirs = dict(owner), dict(assigned)
    if any(mine.get(k, theirs[k]) != theirs[k] for k in (N.K8S_POD_NAME, N.K8S_NAMESPACE) if k in theirs):
        return owner
    merged = {**theirs, **mine}
    return tuple((k, merged[k]) for k in N.OWNER_ATTRIBUTES if merged.get(k))


class Labels:
    """One device's owner and its readings relabelled with it, each attributes dict built once
    per owner (readings share attribute dicts: the store files them by identity)."""

    __slots__ = ("owner", "attrs", "_cache")

    def __init__(self):
        self.owner: Owner = ()
        self.attrs: dict[str, str] = {}
        self._cache: dict[int, tuple] = {}   # id(attrs) -> (attrs, attrs + owner)

    def set(self, owner: Owner) -> None:
        if owner != self.owner:
            self.owner, self.attrs, self._cache = owner, dict(owner), {}

    def apply(self, readings: list[Reading]) -> list[Reading]:
        """`readings` with the owner's attributes added (as they are when there is no owner)."""
        if not self.owner:
            return readings
        cache, owner, out = self._cache, self.attrs, []
        if len(cache) > 1024:
            cache.clear()
        for r in readings:
            a = r.attributes
            hit = cache.get(id(a))
            if hit is None or hit[0] is not a:
                hit = cache[id(a)] = (a, {**a, **owner})
            out.append(new_reading(Reading, (r.spec, r.value, hit[1])))
        return out
