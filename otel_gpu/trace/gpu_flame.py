"""GPU time by the code that launched it: each kernel, copy and memset's duration under its launch stack.

A GPU event's correlation id names the runtime call (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...)
that launched it on a CPU thread; the CPU events that enclose that call on the thread (nested as
:mod:`.call_stack` nests them, the backward thread under the step) are its stack: Python frames
where the trace has them (``with_stack=True``; ``with_modules=True`` adds ``nn.Module`` frames),
otherwise the CPU ops and annotations. The stack, root first, gets the event's duration:

- the leaf is the kernel's name; NCCL kernels sit under a ``[nccl]`` frame, copies under
  ``[memcpy HtoD]`` (``DtoH``, ``DtoD``, ...), memsets under ``[memset]``;
- the runtime call itself is not a frame; ``ProfilerStep#N`` is folded to ``ProfilerStep`` so the
  steps add up;
- an event whose launch is not in the trace sits under ``[launch not in the trace]``.

Values are nanoseconds of GPU time (durations in us, rounded to whole ns per event): a rank's stacks
add up to the total duration of its kernels, copies and memsets (overlapping events each count in
full). The events are those analysed (kernels launched in the last ProfilerStep are left out, as in
every other analysis, unless the set keeps it). Frame names come from the trace: each is shown as
:func:`~otel_gpu.safe_text.visible` shows it, with ``;`` (the folded format's separator) as ``\\x3b``.
"""
from __future__ import annotations

import re

import numpy as np

from ..safe_text import visible
from . import call_stack
from .model import COMMUNICATION, MEMORY, RankView, TraceSet, load_set

UNIT = "nanoseconds"
SAMPLE_TYPE = "gpu_time"
GPU_WORK_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")  # Kineto's, old and new spelling
NO_LAUNCH = "[launch not in the trace]"
_STEP = re.compile(r"^ProfilerStep#\d+$")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>$")
_COPY_KIND = re.compile(r"^Memcpy (\w+?to\w+)")


def frame(name: str) -> str:
    """A name from the trace as a frame: visible, ``;`` escaped, a step annotation without its number,
    a built-in's object address left out (``<built-in method run_backward of ... object>``: the same
    frame in every process and run)."""
    if _STEP.match(name):
        return "ProfilerStep"
    return _ADDRESS.sub(">", visible(name)).replace(";", "\\x3b")


def kind_frame(name: str, kind: str) -> str | None:
    """The frame that labels what a GPU event is, above its own name; None for computation."""
    if kind == COMMUNICATION:
        return "[nccl]"
    if name.startswith("Memset"):
        return "[memset]"
    if kind == MEMORY or name.startswith("Memcpy"):
        m = _COPY_KIND.match(name)
        return f"[memcpy {m.group(1)}]" if m else "[memcpy]"
    return None


def gpu_work_rows(v: RankView) -> np.ndarray:
    """Positions (into ``v.ev``) of the analysed kernels, copies and memsets, each event once."""
    ev = v.ev
    rows = np.unique(v.rows)
    cats = np.array([c.lower() in GPU_WORK_CATS for c in ev.names] or [False], dtype=bool)
    return rows[(ev.stream[rows] != -1) & cats[ev.cat[rows]]]


def durations_ns(v: RankView, rows: np.ndarray) -> np.ndarray:
    """Durations (us in the trace) of rows as whole nanoseconds."""
    return np.rint(np.maximum(v.ev.dur[rows], 0) * 1000).astype(np.int64)


def _launch_of(v: RankView, cs: call_stack.CallStacks, rows: np.ndarray) -> np.ndarray:
    """The launch call (position) of each GPU event, -1 when it is not in the stacks."""
    parent = cs.parent[rows]
    return np.where(parent >= 0, parent, -1)


def gpu_time_stacks(v: RankView, cs: call_stack.CallStacks | None = None) -> dict[tuple[str, ...], int]:
    """Folded stacks (frames root first, see the module's doc) -> GPU time (ns) of one rank."""
    cs = cs or call_stack.build(v)
    ev = v.ev
    rows = gpu_work_rows(v)
    ns = durations_ns(v, rows)
    launch = _launch_of(v, cs, rows)
    parent = cs.parent
    names = ev.names
    path_of: dict[int, int] = {-1: 0}          # event position -> path id (the frames above and itself)
    paths: list[tuple[int, int]] = [(-1, -1)]  # path id -> (parent path id, name id); 0: the root
    path_ids: dict[tuple[int, int], int] = {}

    def path(node: int) -> int:
        chain = []
        while node not in path_of:
            chain.append(node)
            node = int(parent[node]) if parent[node] >= 0 else -1
            if len(chain) > len(parent):   # a loop of parents (damaged input): cut at the root
                node = -1
        pid = path_of[node]
        for n in reversed(chain):
            key = (pid, int(ev.name[n]))
            pid = path_ids.get(key)
            if pid is None:
                pid = path_ids[key] = len(paths)
                paths.append(key)
            path_of[n] = pid
        return pid

    # the launch call is not a frame: stacks start at the CPU event enclosing it
    above = np.where(launch >= 0, parent[np.maximum(launch, 0)], -2)
    totals: dict[tuple[int, int], int] = {}
    for a, name_id, value in zip(above.tolist(), ev.name[rows].tolist(), ns.tolist()):
        key = (path(a) if a >= 0 else (0 if a == -1 else -1), name_id)
        totals[key] = totals.get(key, 0) + value
    kinds = v.name_types()
    texts: dict[int, tuple[str, ...]] = {0: ()}

    def frames(pid: int) -> tuple[str, ...]:
        got = texts.get(pid)
        if got is None:
            chain = []
            while pid not in texts:
                chain.append(pid)
                pid = paths[pid][0]
            got = texts[pid]
            for p in reversed(chain):
                got = texts[p] = got + (frame(names[paths[p][1]]),)
        return got
    out: dict[tuple[str, ...], int] = {}
    for (pid, name_id), value in totals.items():
        name = names[name_id]
        kind = kind_frame(name, kinds[name_id])
        stack = ((NO_LAUNCH,) if pid < 0 else frames(pid)) + ((kind,) if kind else ()) + (frame(name),)
        out[stack] = out.get(stack, 0) + value
    return out


def folded_text(stacks: dict[tuple[str, ...], int]) -> str:
    """Brendan Gregg's folded format, one ``frame;frame;leaf value`` line per stack, largest first."""
    rows = sorted(stacks.items(), key=lambda kv: (-kv[1], kv[0]))
    return "".join(f"{';'.join(s)} {n}\n" for s, n in rows if n > 0)


def set_stacks(ts: TraceSet) -> dict[int, dict[tuple[str, ...], int]]:
    """Every rank's GPU-time stacks (ns)."""
    return {rank: gpu_time_stacks(v) for rank, v in sorted(ts.ranks.items())}


def trace_dir_stacks(directory: str, include_last_step: bool = False,
                     jobs: int | None = 1) -> dict[int, dict[tuple[str, ...], int]]:
    """Per rank, the folded GPU-time stacks (frames root first -> ns) of a folder of per-rank traces
    (TraceFormatError when it holds none); for a report made after a run."""
    return set_stacks(load_set(directory, include_last_step=include_last_step, jobs=jobs))


def top_stacks(per_rank: dict[int, dict[tuple[str, ...], int]], n: int = 10) -> list[tuple[tuple[str, ...], int, float]]:
    """The ``n`` stacks with the most GPU time over all ranks: (frames, ns, % of all GPU time)."""
    pooled: dict[tuple[str, ...], int] = {}
    for stacks in per_rank.values():
        for s, ns in stacks.items():
            pooled[s] = pooled.get(s, 0) + ns
    total = sum(pooled.values())
    rows = sorted(pooled.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [(s, ns, round(100.0 * ns / total, 1) if total else 0.0) for s, ns in rows]
