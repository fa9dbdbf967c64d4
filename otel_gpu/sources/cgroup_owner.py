"""Which Slurm job or Kubernetes pod a process belongs to, from its cgroup path (pure functions).

`/proc/<pid>/cgroup` names the control groups of a process, one `ID:CONTROLLERS:PATH` line each
(cgroup v2: the one line `0::PATH`). The job managers put their processes in paths of known shapes:

- Slurm, cgroup v2: `/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0`
  (steps `batch`, `extern`, `interactive` and numbers);
- Slurm, cgroup v1: `/slurm/uid_1000/job_1234/step_0/task_0` (`/slurm_<node>/...` with several slurmd);
- Kubernetes with the systemd driver: `/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid, '_' for '-'>.slice/cri-containerd-<id>.scope` (`crio-<id>.scope`
  under CRI-O, `docker-<id>.scope` under Docker; guaranteed pods sit right under kubepods.slice);
- Kubernetes with the cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`.

A path seen from another cgroup namespace starts with `/..` components; the shapes are found
anywhere in the path. Values are checked against their formats (digits, a UUID, 64 hex digits),
so nothing else from the path reaches a label.
"""
from __future__ import annotations

import re
from typing import NamedTuple

MAX_LINES = 64   # lines of one cgroup file looked at (v1 has ~13, v2 one)

_SLURM_JOB = re.compile(r"job_([0-9]{1,20})")
_SLURM_STEP = re.compile(r"step_([0-9]{1,10}|batch|extern|interactive)")
_UUID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_POD = re.compile(r"(?:kubepods(?:-[a-z]+)*-)?pod(" + _UUID + r")(?:\.slice)?")
_CONTAINER_SCOPE = re.compile(r"(?:cri-containerd|crio|docker|containerd)-([0-9a-f]{64})\.scope")
_CONTAINER_BARE = re.compile(r"([0-9a-f]{64})")


class CgroupOwner(NamedTuple):
    """What a cgroup path says about its process (None: not said)."""

    slurm_job: str | None = None      # Slurm job id, digits
    slurm_step: str | None = None     # step: a number, 'batch', 'extern' or 'interactive'
    pod_uid: str | None = None        # Kubernetes pod UID, lower case with dashes
    container_id: str | None = None   # container id, 64 hex digits

    def __bool__(self) -> bool:
        return any(v is not None for v in self)


NOBODY = CgroupOwner()


def owner_from_path(path: str) -> CgroupOwner:
    """The Slurm job and step, or Kubernetes pod UID and container id, named by one cgroup path."""
    job = step = pod = container = None
    in_kubepods = False
    for part in path.split("/"):
        if not part or part == "..":
            continue
        if part.startswith("kubepods"):
            in_kubepods = True
        m = _SLURM_JOB.fullmatch(part)
        if m:
            job, step = m.group(1), None
            continue
        m = _SLURM_STEP.fullmatch(part)
        if m and job is not None and step is None:
            step = m.group(1)
            continue
        m = _POD.fullmatch(part)
        if m:
            pod = m.group(1).replace("_", "-").lower()
            continue
        if pod is not None:
            m = _CONTAINER_SCOPE.fullmatch(part) or _CONTAINER_BARE.fullmatch(part)
            if m:
                container = m.group(1)
    if pod is not None and not in_kubepods:
        pod = container = None   # a 'pod<uuid>' component outside any kubepods tree: not a pod
    return CgroupOwner(job, step, pod, container)


def parse_cgroup_file(text: str) -> CgroupOwner:
    """The owner named by a `/proc/<pid>/cgroup` file: the v2 line (`0::`) first, then the v1
    lines in order; the first path that names a job or a pod wins."""
    paths = []
    for line in text.splitlines()[:MAX_LINES]:
        hid, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2):
            continue
        if hid == "0" and not controllers:
            paths.insert(0, path)
        else:
            paths.append(path)
    for path in paths:
        owner = owner_from_path(path)
        if owner:
            return owner
    return NOBODY
