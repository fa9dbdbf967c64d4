"""GPU memory per process (NVML's running compute processes), with each process's executable
name, rank and owner (its job or pod, gpu_owner.py) read from `proc_root` once while its PID stays.
PIDs that are no process here are dropped and counted by reason. Used by `NvmlSource` (nvml.py)."""
from __future__ import annotations

import os
from collections import Counter
from typing import Callable

from .. import names as N
from ..readings import Reading, new_reading
from .gpu_owner import Owner, owner_attributes, pick, pid_problem, read_cgroup_owner, with_assignment
from .nvml_device import SKIP, Device
from .procenv import rank_from_env, read_environ

Info = tuple[str, "str | None", Owner]   # (executable name, rank, owner attribute items)


class GpuProcesses:
    """`readings(dev, pids)`: one `otelgpu.gpu.process.memory` reading (bytes) per process on
    `dev`, and `dev`'s owner set in `dev.labels`. `call` is the source's NVML call
    (nvml_device.call, bound); `proc_root` is where `/proc/<pid>/{comm,environ,cgroup}` are read.
    `dropped_counts` counts the PIDs dropped, by reason (each once while NVML lists it)."""

    def __init__(self, call: Callable, proc_root: str = "/proc", assigned: Callable[[], dict] | None = None):
        self._call, self._proc_root = call, proc_root
        self._assigned = assigned     # the kubelet's GPU UUID -> pod map (podresources.py), when read
        self._cache: dict[int, Info] = {}
        self.dropped: dict[int, str] = {}                 # PID -> why, while listed
        self._listed: set[int] = set()
        self.dropped_counts: Counter = Counter()

    def readings(self, dev: Device, pids: set[int]) -> list[Reading]:
        """`dev`'s processes (their PIDs added to `pids`); [] when NVML cannot list them."""
        procs = self._call(dev, "processes", "nvmlDeviceGetComputeRunningProcesses", dev.handle)
        labels = dev.labels
        if procs is SKIP:
            labels.set(self._owner(dev, ()))
            return []
        used: dict[int, float] = {}
        for p in procs:
            pid = int(p.pid)
            self._listed.add(pid)
            if pid not in self._cache and self._drop(pid):
                continue
            mem = getattr(p, "usedGpuMemory", None)
            used[pid] = used.get(pid, 0.0) + float(mem or 0)
        out, owners = [], []
        for pid, mem in sorted(used.items()):
            pids.add(pid)
            info = self.info(pid)
            owners.append((mem, pid, info[2]))
            attrs = dev.proc_attrs.get((pid, info))
            if attrs is None:   # built once per process: the store then files its reading by identity
                if len(dev.proc_attrs) > 256:
                    dev.proc_attrs.clear()
                exe, rank, owner = info
                attrs = {**dev.attrs, N.PID: str(pid), N.EXECUTABLE: exe}
                if rank is not None:
                    attrs[N.RANK] = rank
                attrs.update(owner)
                dev.proc_attrs[(pid, info)] = attrs
            out.append(new_reading(Reading, (N.GPU_PROCESS_MEMORY, mem, attrs)))
        labels.set(self._owner(dev, pick(owners)))
        return out

    def _owner(self, dev: Device, owner: Owner) -> Owner:
        if self._assigned is None:
            return owner
        return with_assignment(owner, self._assigned().get(dev.uuid))

    def _drop(self, pid: int) -> bool:
        """True when `pid` is no process here (counted once while listed)."""
        why = pid_problem(pid, self._proc_root)
        if why is not None and self.dropped.get(pid) != why:
            self.dropped[pid] = why
            self.dropped_counts[why] += 1
        return why is not None

    def info(self, pid: int) -> Info:
        """(executable name, rank, owner) of `pid` from `proc_root`, cached while the PID stays."""
        info = self._cache.get(pid)
        if info is None:
            try:
                with open(os.path.join(self._proc_root, str(pid), "comm"), encoding="utf-8", errors="replace") as f:
                    exe = f.read(256).strip()
            except OSError:
                exe = ""
            env = read_environ(pid, self._proc_root)
            owner = owner_attributes(read_cgroup_owner(pid, self._proc_root), env)
            info = self._cache[pid] = (exe, rank_from_env(env) if env is not None else None, owner)
        return info

    def keep(self, pids: set[int]) -> None:
        """Forget the processes not in `pids` (gone since), and dropped PIDs no longer listed."""
        if len(self._cache) != len(pids) or any(p not in pids for p in self._cache):
            self._cache = {p: v for p, v in self._cache.items() if p in pids}
        if self.dropped:
            self.dropped = {p: why for p, why in self.dropped.items() if p in self._listed}
        self._listed = set()
