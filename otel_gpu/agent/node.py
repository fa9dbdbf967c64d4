"""Assembles this node's sources from the agent's settings (the one place that knows them all)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..readings import Source, SourceError


@dataclass(frozen=True)
class NodeConfig:
    """Where to read from; roots are parameters so tests and benchmarks can point elsewhere."""
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    checkpoint_dirs: tuple[str, ...] = ()
    process_patterns: tuple[str, ...] = ()   # command-line substrings of training processes
    fake_gpus: int = 0                       # > 0: a fake NVML with that many Hopper GPUs
    gpus: bool = True
    interval_s: float = 1.0                  # the sampling interval (s): GPM spaces its samples by it
    job_pid: int | None = None               # the processes below it are the job's (`otel-gpu run`/`tune` pass theirs)
    kubelet_socket: str | None = None        # the kubelet's PodResources socket: GPUs assigned to pods


@dataclass
class Node:
    sources: list[Source]
    notes: list[str] = field(default_factory=list)   # one line each: what is off and why
    gpu: Source | None = None

    def close(self) -> None:
        for s in self.sources:
            close = getattr(s, "close", None)
            if callable(close):
                close()


def _nvml_module(config: NodeConfig):
    if config.fake_gpus:
        from ..sources.fake_nvml import fake_cluster_node
        return fake_cluster_node(n=config.fake_gpus)
    import pynvml
    return pynvml


def build_node(config: NodeConfig) -> Node:
    """Every source this node supports; a missing GPU driver turns GPU metrics off, not the agent."""
    from ..sources.disk import DiskSource
    from ..sources.host import HostSource
    from ..sources.infiniband import InfinibandSource
    from ..sources.net import NetSource
    from ..sources.process import PidFinder, ProcessSource
    from ..sources.proctree import TreeFinder

    node = Node(sources=[])
    if config.gpus:
        from ..sources.nvml import NvmlSource
        pods = None
        if config.kubelet_socket:
            from ..sources.podresources import PodResourcesReader
            pods = PodResourcesReader(config.kubelet_socket).start()
            if pods.problem:
                node.notes.append(f"GPUs held by idle pods are not labelled until this works: {pods.problem}")
        try:
            # costly NVML calls (energy, PCIe throughput) run on a thread of their own: never in the round
            node.gpu = NvmlSource(nvml=_nvml_module(config), proc_root=config.proc_root, background=True,
                                  interval_s=config.interval_s, pod_resources=pods)
            node.sources.append(node.gpu)
        except SourceError as exc:
            node.notes.append(str(exc))  # the source says what is off and why, in one line
            if pods is not None:
                pods.stop()
    else:
        node.notes.append("GPU metrics are off: disabled by --no-gpu")
    disk = DiskSource(proc_root=config.proc_root, sys_root=config.sys_root, paths=config.checkpoint_dirs)
    node.sources += [HostSource(), NetSource(sys_root=config.sys_root, proc_root=config.proc_root), disk]
    if Path(config.sys_root, "class", "infiniband").is_dir():
        node.sources.append(InfinibandSource(sys_root=config.sys_root))

    gpu = node.gpu
    named = PidFinder(config.process_patterns, proc_root=config.proc_root) if config.process_patterns else None
    fake = getattr(gpu, "_nvml", None) if config.fake_gpus else None
    if named is not None and hasattr(fake, "adopt"):   # the fake GPUs run the named ranks (fake_ranks.py)
        from ..sources.fake_ranks import adopter
        fake.adopt(adopter(named, config.proc_root))

    def watched() -> set[int]:
        """Processes on a GPU, plus those the user named (rescanned at most every 5 s)."""
        pids = set(gpu.gpu_pids()) if gpu is not None else set()
        if named is not None:
            pids |= set(named())
        return pids

    below = TreeFinder(watched, config.job_pid, proc_root=config.proc_root)

    def training_pids() -> set[int]:
        """Those, the processes they started (a rank's DataLoader workers) and the job's own below
        `job_pid`: the job's processes, whose CPU the input rule judges."""
        return watched() | below()

    node.sources.append(ProcessSource(training_pids, proc_root=config.proc_root))
    return node
