"""The work a job did in a diagnosis window: model FLOPs, tokens and compute dtype per rank, dense peaks per
GPU. The PromQL parts join `rank_summary`'s and `gpu_summary`'s unions (no extra request); `work_inputs` and
`peak_inputs` turn their values into RankStats / GpuStats fields. record/work.py computes the same from a
recording; mfu.py and account.py judge them."""
from __future__ import annotations

from typing import Any

from .. import names as N

DTYPE = "otelgpu_dtype"
BASIS = "otelgpu_flops_basis"
RANK_BY = "host_name, otelgpu_rank"
JOB_RANK_BY = "otelgpu_job, host_name, otelgpu_rank"   # a rank across jobs: joins FLOPs to GPUs


def work_parts(job_sel: str, W: str, selector) -> dict[str, str]:
    """rank_summary parts: model FLOPs by basis and tokens (last value and value at the window start), the
    compute dtype gauge's last labels."""
    flops = selector(N.TRAIN_FLOPS.prometheus_name(), job_sel)
    tokens = selector(N.TRAIN_TOKENS.prometheus_name(), job_sel)
    dtype = selector(N.TRAIN_COMPUTE_DTYPE.prometheus_name(), job_sel)
    return {
        f"flops:{BASIS}": f"sum by ({RANK_BY}, {BASIS}) (last_over_time({flops}[{W}]))",
        f"flops0:{BASIS}": f"sum by ({RANK_BY}, {BASIS}) ({flops} offset {W})",
        "tokens": f"sum by ({RANK_BY}) (last_over_time({tokens}[{W}]))",
        "tokens0": f"sum by ({RANK_BY}) ({tokens} offset {W})",
        f"dtype:{DTYPE}": f"max by ({RANK_BY}, {DTYPE}) (last_over_time({dtype}[{W}]))",
    }


def peak_part(agent_sel: str, W: str, selector, gpu_by: str) -> dict[str, str]:
    """gpu_summary part: each GPU's dense peak per dtype."""
    sel = selector(N.GPU_PEAK_FLOPS, agent_sel)
    return {f"peak:{DTYPE}": f"max by ({gpu_by}, {DTYPE}) (max_over_time({sel}[{W}]))"}


def _tagged(v: dict[str, Any], tag: str) -> dict[str, float]:
    prefix = tag + "_"
    return {k[len(prefix):]: x for k, x in v.items() if k.startswith(prefix) and x is not None}


def work_inputs(v: dict[str, Any]) -> dict[str, Any]:
    """A rank's RankStats fields (flops, flops_basis, tokens, compute_dtype) from its rank_summary statistics."""
    last, start = _tagged(v, "flops"), _tagged(v, "flops0")
    flops = {b: max(0.0, x - start.get(b, 0.0)) for b, x in last.items()}
    tokens = v.get("tokens")
    dtypes = sorted(d for d in _tagged(v, "dtype") if d)
    return dict(flops=sum(flops.values()) if flops else None, flops_basis="+".join(sorted(flops)),
                tokens=None if tokens is None else max(0.0, tokens - (v.get("tokens0") or 0.0)),
                compute_dtype=dtypes[0] if len(dtypes) == 1 else "")


def peak_inputs(v: dict[str, Any]) -> dict[str, float]:
    """A GPU's dtype -> dense peak FLOP/s from its gpu_summary statistics."""
    return {d: x for d, x in _tagged(v, "peak").items() if d and x > 0}


def _on_gpu(agent_sel: str) -> str:
    """(job, host, rank) -> hw_id of the GPUs NVML lists the rank's processes on, as a 1-valued vector (the
    process series carry their process's job, gpu_owner.py: two jobs' rank 0 on one host stay apart)."""
    mem = N.GPU_PROCESS_MEMORY.prometheus_name()
    sel = ", ".join(x for x in (agent_sel, 'otelgpu_rank!=""') if x)
    return f"group by ({JOB_RANK_BY}, hw_id) ({mem}{{{sel}}})"


def flops_per_gpu_promql(job_sel: str, agent_sel: str, rng: str) -> str:
    """PromQL: achieved model FLOP/s per GPU (host_name, hw_id) over `rng` (the ranks' GPUs from the process list)."""
    flops = f"{N.TRAIN_FLOPS.prometheus_name()}{{{job_sel}}}"
    return (f"sum by (host_name, hw_id) (sum by ({JOB_RANK_BY}) (rate({flops}[{rng}])) "
            f"* on ({JOB_RANK_BY}) group_left (hw_id) {_on_gpu(agent_sel)})")


def mfu_promql(job_sel: str, agent_sel: str, rng: str) -> str:
    """PromQL: MFU per rank (otelgpu_job, host_name, otelgpu_rank, hw_id, otelgpu_dtype) over `rng`: its FLOP/s over
    the dense peak of its GPU in the dtype it computes in (no series where a part is missing: 'not checked')."""
    flops = f"{N.TRAIN_FLOPS.prometheus_name()}{{{job_sel}}}"
    dtype = f"{N.TRAIN_COMPUTE_DTYPE.prometheus_name()}{{{job_sel}}}"
    peak = N.GPU_PEAK_FLOPS.prometheus_name() + (f"{{{agent_sel}}}" if agent_sel else "")
    return (f"sum by ({JOB_RANK_BY}, {DTYPE}) (rate({flops}[{rng}]) * on ({JOB_RANK_BY}) group_left ({DTYPE}) "
            f"max by ({JOB_RANK_BY}, {DTYPE}) ({dtype})) "
            f"* on ({JOB_RANK_BY}) group_left (hw_id) {_on_gpu(agent_sel)} "
            f"/ on (host_name, hw_id, {DTYPE}) group_left max by (host_name, hw_id, {DTYPE}) ({peak})")
