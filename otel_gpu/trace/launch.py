"""CUDA kernel launch statistics (HTA 0.5.0 semantics).

Each launch runtime call (cudaLaunchKernel, cudaLaunchKernelExC, and with memory events
cudaMemcpyAsync / cudaMemsetAsync) is paired with its GPU event by correlation id:
``cpu_duration`` (us) of the call, ``gpu_duration`` (us) of the kernel, and
``launch_delay`` = kernel start - call end, clipped at 0 (us).
"""
from __future__ import annotations

import numpy as np

from .model import RankView

LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC",
                "runFunction - job_prep_and_submit_for_execution")
MEMORY_LAUNCH_NAMES = ("cudaMemcpyAsync", "cudaMemsetAsync")


def launch_pairs(v: RankView, include_memory_events: bool = True) -> dict[str, np.ndarray]:
    """Per launch/kernel pair (in HTA's row order): correlation, cpu/gpu duration, launch delay,
    and the rows of both events. Computed once per rank until ``v.clear_cache()`` (the launch
    statistics and the findings both read it; callers must not modify it)."""
    return v.cached(f"launch_pairs:{include_memory_events}", lambda: _launch_pairs(v, include_memory_events))


def _launch_pairs(v: RankView, include_memory_events: bool) -> dict[str, np.ndarray]:
    ev = v.ev
    wanted = LAUNCH_NAMES + (MEMORY_LAUNCH_NAMES if include_memory_events else ())
    ids = v.symbol_ids(wanted)
    rows = v.rows
    names = ev.name[rows]
    is_launch = np.zeros(len(ev.names) + 1, dtype=bool)   # a look-up by name id (np.isin sorts)
    is_launch[ids] = True
    corr_set = np.unique(ev.correlation[rows[is_launch[names]]])
    in_set = _member(ev.correlation[rows], corr_set)
    stream = ev.stream[rows]
    cpu = rows[in_set & (stream == -1)]
    gpu = rows[in_set & (stream != -1)]
    # many-to-many inner join on correlation, left (CPU) order kept, right order within a key
    gcorr = ev.correlation[gpu]
    gorder = np.argsort(gcorr, kind="stable")
    gsorted = gcorr[gorder]
    ccorr = ev.correlation[cpu]
    lo = np.searchsorted(gsorted, ccorr, "left")
    hi = np.searchsorted(gsorted, ccorr, "right")
    counts = hi - lo
    left = np.repeat(cpu, counts)
    starts = np.repeat(lo, counts)
    offs = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    right = gpu[gorder[starts + offs]] if len(offs) else gpu[:0]
    cpu_dur = ev.dur[left]
    delay = (ev.ts[right] - ev.ts[left]) - cpu_dur
    return {"correlation": ev.correlation[left], "cpu_duration": cpu_dur,
            "gpu_duration": ev.dur[right], "launch_delay": np.clip(delay, 0, None),
            "cpu_rows": left, "gpu_rows": right}


def _member(x: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin(x, sorted_set)`` for a sorted array of distinct values, by binary search."""
    if len(sorted_set) == 0:
        return np.zeros(len(x), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_set, x), len(sorted_set) - 1)
    return sorted_set[pos] == x


def launch_summary(pairs: dict[str, np.ndarray], runtime_cutoff: float = 50,
                   launch_delay_cutoff: float = 100) -> dict:
    """Counts as HTA plots them: short kernels (gpu < cpu duration, cpu <= cutoff), runtime
    outliers (cpu > cutoff), launch-delay outliers (delay > cutoff); plus totals in us."""
    cpu, gpu, delay = pairs["cpu_duration"], pairs["gpu_duration"], pairs["launch_delay"]
    short = (cpu <= runtime_cutoff) & (gpu < cpu)
    out = (cpu > runtime_cutoff)
    late = delay > launch_delay_cutoff
    return {"launches": int(len(cpu)), "short_kernels": int(short.sum()),
            "short_kernel_gpu_time_us": float(gpu[short].sum()),
            "runtime_outliers": int(out.sum()), "runtime_outlier_time_us": float(cpu[out].sum()),
            "launch_delay_outliers": int(late.sum()), "launch_delay_outlier_time_us": float(delay[late].sum()),
            "mean_cpu_duration_us": float(cpu.mean()) if len(cpu) else float("nan"),
            "mean_launch_delay_us": float(delay.mean()) if len(delay) else float("nan"),
            "runtime_cutoff_us": runtime_cutoff, "launch_delay_cutoff_us": launch_delay_cutoff}
