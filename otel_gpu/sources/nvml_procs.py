"""GPU memory per process (NVML's running compute processes), with each process's executable
name and rank read from `proc_root` once while its PID stays. Used by `NvmlSource` (nvml.py)."""
from __future__ import annotations

import os
from typing import Callable

from .. import names as N
from ..readings import Reading, new_reading
from .nvml_device import SKIP, Device
from .procenv import rank_of


class GpuProcesses:
    """`readings(dev, pids)`: one `otelgpu.gpu.process.memory` reading (bytes) per process on
    `dev`. `call` is the source's NVML call (nvml_device.call, bound); `proc_root` is where
    `/proc/<pid>/comm` and the rank's environment are read."""

    def __init__(self, call: Callable, proc_root: str = "/proc"):
        self._call, self._proc_root = call, proc_root
        self._cache: dict[int, tuple[str, str | None]] = {}

    def readings(self, dev: Device, pids: set[int]) -> list[Reading]:
        """`dev`'s processes (their PIDs added to `pids`); [] when NVML cannot list them."""
        procs = self._call(dev, "processes", "nvmlDeviceGetComputeRunningProcesses", dev.handle)
        if procs is SKIP:
            return []
        used: dict[int, float] = {}
        for p in procs:
            mem = getattr(p, "usedGpuMemory", None)
            used[int(p.pid)] = used.get(int(p.pid), 0.0) + float(mem or 0)
        out = []
        for pid, mem in sorted(used.items()):
            pids.add(pid)
            info = self.info(pid)
            attrs = dev.proc_attrs.get((pid, info))
            if attrs is None:   # built once per process: the store then files its reading by identity
                if len(dev.proc_attrs) > 256:
                    dev.proc_attrs.clear()
                exe, rank = info
                attrs = {**dev.attrs, N.PID: str(pid), N.EXECUTABLE: exe}
                if rank is not None:
                    attrs[N.RANK] = rank
                dev.proc_attrs[(pid, info)] = attrs
            out.append(new_reading(Reading, (N.GPU_PROCESS_MEMORY, mem, attrs)))
        return out

    def info(self, pid: int) -> tuple[str, str | None]:
        """(executable name, rank) of `pid` from `proc_root`, cached while the PID stays."""
        info = self._cache.get(pid)
        if info is None:
            try:
                with open(os.path.join(self._proc_root, str(pid), "comm"), encoding="utf-8", errors="replace") as f:
                    exe = f.read().strip()
            except OSError:
                exe = ""
            info = self._cache[pid] = (exe, rank_of(pid, self._proc_root))
        return info

    def keep(self, pids: set[int]) -> None:
        """Forget the processes not in `pids` (gone since)."""
        if len(self._cache) != len(pids) or any(p not in pids for p in self._cache):
            self._cache = {p: v for p, v in self._cache.items() if p in pids}
