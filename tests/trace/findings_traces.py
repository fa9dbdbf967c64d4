"""Crafted GPU traces for the expert findings: each one with a pattern present and its twin without.

Built on :class:`kineto.Builder` (PyTorch 2.x Kineto event shapes). Times in us; 4 ProfilerSteps of
10 ms, the last one excluded by the analysis (as in HTA).
"""
from __future__ import annotations

import gzip
import json
import os

from kineto import STEP_US, Builder

H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85017755648, "computeMajor": 9,
        "computeMinor": 0, "numSms": 132}
A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85100068864, "computeMajor": 8,
        "computeMinor": 0, "numSms": 108}
GEMM_SM80_ALIGN1 = ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_stage4_warpsize2x2x1_"
                    "tensor16x8x16_align1_execute_kernel__5x_cublas")
GEMM_SM80 = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage5_warpsize2x2x1_tensor16x8x16_kernel"
GEMM_SM90 = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
             "kernel__5x_cublas")
SGEMM = "ampere_sgemm_128x64_nn"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4>(int, float*)"
DATA_LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def write(b: Builder, path: str, device: dict | None = None, record_shapes: bool = False) -> str:
    """The builder's events as a trace file, with the device and record_shapes keys Kineto writes."""
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": b.rank, "world_size": 1},
           "traceEvents": b.events, "traceName": os.path.basename(path)}
    if device:
        doc["deviceProperties"] = [device]
    if record_shapes:
        doc["record_shapes"] = 1
    with (gzip.open if path.endswith(".gz") else open)(path, "wt") as fh:
        json.dump(doc, fh)
    return path


def kernel(b: Builder, op: str, name: str, cpu_ts: float, gpu_ts: float, gpu_dur: float, stream: int = 7,
           cat: str = "kernel", runtime: str = "cudaLaunchKernel", runtime_dur: float = 5,
           dims: list | None = None, types: list | None = None) -> None:
    """One op launching one GPU event; ``dims``/``types`` become the op's Input Dims / Input type."""
    args = {"Input Dims": dims, "Input type": types or ["c10::BFloat16"] * len(dims)} if dims else None
    ext = b.cpu(op, cpu_ts, runtime_dur + 2, args=args)
    corr = b.runtime(runtime, cpu_ts + 1, runtime_dur, ext)
    b.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": gpu_ts, "dur": gpu_dur,
                     "args": {"External id": ext, "device": 0, "stream": stream, "correlation": corr}})


def drain_trace(*, item=True, pageable=True, ddp_syncs=0, stray_syncs=0, short_event_syncs=0) -> Builder:
    """A step as a GPT-2 run on an H100 lays it out: the data loader (1.5 ms), a host-to-device copy of the
    batch (pageable: a 300 us blocking call; pinned: 10 us), 60 kernels of 100 us launched every 20 us (the
    CPU runs ahead, the queue builds up to ~50), then ``.item()`` on the loss: a 4.7 ms stream sync that
    returns when the GPU has drained. The GPU then idles until the next step's copy.

    ``ddp_syncs``: event syncs of 5 us inside ``DistributedDataParallel.forward`` per step;
    ``stray_syncs``: stream syncs of 5 us by the user per step; ``short_event_syncs``: event syncs of 3 us."""
    b = Builder(0)
    for step in range(4):
        t0 = 1_000_000 + step * STEP_US
        b.cpu(f"ProfilerStep#{step + 1}", t0, STEP_US - 1, cat="user_annotation")
        b.cpu(DATA_LOADER, t0, 1500, cat="user_annotation")
        copy = "Memcpy HtoD (Pageable -> Device)" if pageable else "Memcpy HtoD (Pinned -> Device)"
        call = 300 if pageable else 10
        kernel(b, "aten::copy_", copy, t0 + 1500, t0 + 1700 if pageable else t0 + 1520, 80, cat="gpu_memcpy",
               runtime="cudaMemcpyAsync", runtime_dur=call, dims=[[8, 1024], [8, 1024]], types=["long int"] * 2)
        if ddp_syncs:
            b.cpu("DistributedDataParallel.forward", t0 + 1812, 10 * ddp_syncs + 4, cat="user_annotation")
            for i in range(ddp_syncs):
                ext = b.cpu("aten::empty", t0 + 1813 + 10 * i, 7)
                b.runtime("cudaEventSynchronize", t0 + 1814 + 10 * i, 5, ext)
        for i in range(60):  # GPU busy from t0+1970 to t0+7970
            kernel(b, "aten::mm", GEMM_SM90, t0 + 1950 + 20 * i, t0 + 1970 + 100 * i, 100)
        for i in range(stray_syncs):
            ext = b.cpu("aten::is_nonzero", t0 + 3140 + 8 * i, 7)
            b.runtime("cudaStreamSynchronize", t0 + 3141 + 8 * i, 5, ext)
        for i in range(short_event_syncs):
            ext = b.cpu("aten::empty", t0 + 3140 + 8 * i, 7)
            b.runtime("cudaEventSynchronize", t0 + 3141 + 8 * i, 3, ext)
        if item:
            ext = b.cpu("aten::_local_scalar_dense", t0 + 3300, 4690)
            corr = b.runtime("cudaMemcpyAsync", t0 + 3301, 4, ext)
            b.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0,
                             "tid": 7, "ts": t0 + 7970, "dur": 2,
                             "args": {"External id": ext, "device": 0, "stream": 7, "correlation": corr}})
            b.runtime("cudaStreamSynchronize", t0 + 3306, 4674, ext)
    return b


def queue_trace(*, deep: bool, fused_optimizer: bool = False) -> Builder:
    """200 short kernels a step (2 us on the GPU, 5 us launch calls) besides 16 GEMMs.

    ``deep``: GPU-bound. The CPU launches a step's work in its first 2 ms while the GPU still runs the
    previous step's (a queue of ~100; every launch waits > 100 us for the GPU); the GPU runs without a
    gap. Otherwise launch-bound: after 6.4 ms of GEMMs the short kernels are each launched only after
    the previous one ended, and the GPU waits ~13 us for every launch.
    ``fused_optimizer`` adds the op and kernel of ``torch.optim.AdamW(fused=True)``."""
    b = Builder(0)
    for step in range(4):
        t0 = 1_000_000 + step * STEP_US
        b.cpu(f"ProfilerStep#{step + 1}", t0, STEP_US - 1, cat="user_annotation")
        gemm_us = 600 if deep else 400
        for i in range(16):
            kernel(b, "aten::mm", GEMM_SM90, t0 + 10 + 9 * i, t0 + 50 + gemm_us * i, gemm_us)
        for i in range(200):
            cpu = t0 + 200 + 9 * i if deep else t0 + 6500 + 15 * i
            gpu = t0 + 50 + 16 * gemm_us + 2 * i if deep else cpu + 8
            kernel(b, "aten::add_", ELEMENTWISE, cpu, gpu, 2)
        if fused_optimizer:
            kernel(b, "aten::_fused_adamw_", "void at::native::(anonymous namespace)::multi_tensor_apply_kernel"
                   "<FusedAdamMathFunctor<float, 4>>(TensorListMetadata<4>)", t0 + 9600, t0 + 9620, 50)
    return b


def gemm_trace(kernel_name: str, dims: list, *, share: float = 0.25, fp32_kernel: str | None = None) -> Builder:
    """Per step 20 GEMMs of 400 us: ``share`` of them named ``kernel_name`` with input ``dims`` (the LM
    head of a GPT-2), the others aligned sm90 bf16 kernels; ``fp32_kernel`` replaces 4 of the aligned ones."""
    b = Builder(0)
    n_odd = round(20 * share)
    for step in range(4):
        t0 = 1_000_000 + step * STEP_US
        b.cpu(f"ProfilerStep#{step + 1}", t0, STEP_US - 1, cat="user_annotation")
        for i in range(20):
            name, d = (kernel_name, dims) if i < n_odd else (GEMM_SM90, [[8192, 768], [768, 768]])
            types = None
            if fp32_kernel and n_odd <= i < n_odd + 4:
                name, types = fp32_kernel, ["float", "float"]
            kernel(b, "aten::mm", name, t0 + 10 + 12 * i, t0 + 100 + 400 * i, 400, dims=d, types=types)
    return b
