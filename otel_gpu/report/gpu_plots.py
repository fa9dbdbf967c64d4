"""The report's GPU panels, one series per GPU: utilization and SM activity, tensor activity, DRAM
bandwidth, SM occupancy (GPM), memory, power and clocks (NVML), each from the recording and
each value over the interval it describes (see report/align.py). Without any GPU reading one panel
says so, once."""
from __future__ import annotations

import numpy as np

from .. import names as N
from .data import Cells, _by, _num_key, _rows, plot

GPU_METRICS = (N.GPU_UTILIZATION, N.GPU_SM_ACTIVITY, N.GPU_MEMORY_USAGE, N.GPU_POWER, N.GPU_CLOCK)
GPM_WHY = ("GPM needs a Hopper or newer GPU and is not read in MIG mode or with the node agent's GPM turned off")


def _gpus(cells: Cells) -> dict[tuple, str]:
    """(host, GPU index) -> its label (gpuN, or host/gpuN with several hosts), over every GPU metric."""
    keys = {(s.get(N.HOST), s.get(N.GPU_INDEX)) for spec in GPU_METRICS for s in cells.series(spec.name)}
    multi = len({h for h, _ in keys}) > 1
    return {k: (f"{k[0]}/gpu{k[1]}" if multi else f"gpu{k[1]}")
            for k in sorted(keys, key=lambda k: [_num_key(x) for x in k])}


def _per_gpu(cells: Cells, gpus: dict[tuple, str], metric: str, keep=lambda s: True, fn=np.nanmean) -> dict[str, np.ndarray]:
    """GPU label -> the metric's value per cell (several series of one GPU: `fn` across them)."""
    table = _by([s for s in cells.series(metric) if keep(s)], N.HOST, N.GPU_INDEX)
    return {gpus[k]: _rows([cells.value(s) for s in ss], fn) for k, ss in table.items() if k in gpus}


def _pairs(gpus: dict[tuple, str], solid: dict, dashed: dict, what: tuple[str, str]) -> list[tuple]:
    out = []
    for name in gpus.values():
        for label, table, dash in ((what[0], solid, False), (what[1], dashed, True)):
            if name in table:
                out.append((f"{name} {label}".rstrip(), table[name], dash, name))
    return out


def no_gpu_reason(cells: Cells) -> str:
    agent = cells.series(N.SOURCE_UP.name) or cells.series(N.CPU_UTILIZATION.name)
    if agent:
        return "no GPU recorded: the node agent found no NVIDIA GPU (or ran with --no-gpu)"
    return "no GPU recorded: no node agent ran beside the command (otel-gpu run --no-agent, or another node's recording)"


def gpm_missing_reason(cells: Cells) -> str:
    models = sorted({s.get(N.HW_NAME) for spec in GPU_METRICS for s in cells.series(spec.name) if s.get(N.HW_NAME)})
    return f"not recorded: the node agent read no GPM metrics from {', '.join(models) or 'these GPUs'} ({GPM_WHY})"


def gpu_plots(cells: Cells) -> list[dict]:
    gpus = _gpus(cells)
    if not gpus:
        return [{**plot("gpu", "GPUs", "share", cells, []), "empty": no_gpu_reason(cells)}]
    single = lambda table: [(name, table[name], False, name) for name in gpus.values() if name in table]  # noqa: E731
    util, sm = _per_gpu(cells, gpus, N.GPU_UTILIZATION.name), _per_gpu(cells, gpus, N.GPU_SM_ACTIVITY.name)
    gpm = gpm_missing_reason(cells)
    out = [plot("gpu", "GPU utilization (solid: a kernel ran) and SM activity (dashed: SMs busy, GPM), per GPU", "share",
                cells, _pairs(gpus, util, sm, ("util", "SM active")), empty="not recorded: no GPU utilization reading"),
           plot("gpu_tensor", "Tensor pipe activity per GPU (share of cycles, any precision; GPM)", "share", cells,
                single(_per_gpu(cells, gpus, N.GPU_TENSOR_ACTIVITY.name)), empty=gpm),
           plot("gpu_dram", "DRAM bandwidth used per GPU (share of peak; GPM)", "share", cells,
                single(_per_gpu(cells, gpus, N.GPU_DRAM_ACTIVITY.name)), empty=gpm),
           plot("gpu_occupancy", "SM occupancy per GPU (resident warps over the maximum; GPM)", "share", cells,
                single(_per_gpu(cells, gpus, N.GPU_SM_OCCUPANCY.name)), empty=gpm)]
    used = _per_gpu(cells, gpus, N.GPU_MEMORY_USAGE.name, fn=np.nanmax)
    size = _per_gpu(cells, gpus, N.GPU_MEMORY_LIMIT.name, fn=np.nanmax)
    out.append(plot("gpu_memory", "GPU memory in use (solid) against its size (dashed), per GPU", "B", cells,
                    _pairs(gpus, used, size, ("used", "size")), empty="not recorded: no GPU memory reading"))
    power = _per_gpu(cells, gpus, N.GPU_POWER.name)
    limit = _per_gpu(cells, gpus, N.GPU_POWER_LIMIT.name, fn=np.nanmax)
    out.append(plot("gpu_power", "GPU power draw (solid) against the enforced limit (dashed), per GPU", "W", cells,
                    _pairs(gpus, power, limit, ("power", "limit")), empty="not recorded: no GPU power reading"))
    domain = lambda d: (lambda s: s.get(N.CLOCK_DOMAIN) == d)   # noqa: E731
    clock_sm = _per_gpu(cells, gpus, N.GPU_CLOCK.name, domain("sm"))
    clock_mem = _per_gpu(cells, gpus, N.GPU_CLOCK.name, domain("memory"))
    out.append(plot("gpu_clocks", "GPU clocks: SM (solid) and memory (dashed), per GPU", "Hz", cells,
                    _pairs(gpus, clock_sm, clock_mem, ("SM clock", "memory clock")),
                    empty="not recorded: no GPU clock reading"))
    return out

