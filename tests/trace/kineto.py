"""Builder of small crafted Kineto traces (same event shapes as PyTorch 2.x CUDA traces).

``training_trace(**patterns)`` lays out 4 ProfilerSteps of 10 ms on one rank: a CPU step
annotation, ops launching compute kernels back to back on stream 7, one NCCL all-reduce on
stream 20 hidden behind compute, one pinned H2D copy, one stream sync per step and a few
cudaMalloc calls in the first step only. Each keyword switches one anti-pattern on.
"""
from __future__ import annotations

import gzip
import json
import os

STEP_US = 10_000


class Builder:
    def __init__(self, rank: int = 0):
        self.rank = rank
        self.events: list[dict] = [
            {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python"}},
        ]
        self.corr = 1000
        self.ext = 1

    def cpu(self, name: str, ts: float, dur: float, cat: str = "cpu_op", args: dict | None = None) -> int:
        ext = self.ext
        self.ext += 1
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                            "args": {"External id": ext, **(args or {})}})
        return ext

    def runtime(self, name: str, ts: float, dur: float, ext: int) -> int:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts,
                            "dur": dur, "args": {"External id": ext, "cbid": 211, "correlation": self.corr}})
        return self.corr

    def launch(self, op: str, name: str, cpu_ts: float, gpu_ts: float, gpu_dur: float, stream: int = 7,
               cat: str = "kernel", runtime: str = "cudaLaunchKernel", runtime_dur: float = 5) -> None:
        ext = self.cpu(op, cpu_ts, runtime_dur + 2)
        corr = self.runtime(runtime, cpu_ts + 1, runtime_dur, ext)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": gpu_ts,
                            "dur": gpu_dur, "args": {"External id": ext, "device": 0, "stream": stream,
                                                     "correlation": corr}})
        self.events.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": gpu_ts, "cat": "ac2g",
                            "name": "ac2g", "bp": "e"})

    def write(self, path: str) -> str:
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": 2},
               "traceEvents": self.events, "traceName": os.path.basename(path)}
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt") as fh:
            json.dump(doc, fh, indent=1)
        return path


def training_trace(rank: int = 0, *, short_kernels=False, syncs=False, unhidden_nccl=False, idle=False,
                   alloc_thrash=False, pageable=False, compute_scale: float = 1.0, launch_bound=False) -> Builder:
    """``short_kernels`` adds 60 short kernels per step on a second stream while stream 7 is busy (the GPU
    never waits for them); ``launch_bound`` ends the compute early and then launches 100 kernels of 2 us,
    each launched only after the previous one ended (the GPU waits ~7 us for each launch)."""
    b = Builder(rank)
    for step in range(4):
        t0 = 1_000_000 + step * STEP_US
        b.cpu(f"ProfilerStep#{step + 1}", t0, STEP_US - 1, cat="user_annotation")
        n_comp = 10 if idle else 22 if launch_bound else (24 if not unhidden_nccl else 20)
        kdur = 400 * compute_scale if not unhidden_nccl else 350
        for i in range(n_comp):
            b.launch("aten::mm", "ampere_sgemm_128x64_nn", t0 + 10 + i * 12, t0 + 100 + i * kdur, kdur)
        if unhidden_nccl:
            b.launch("nccl:all_reduce", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                     t0 + 400, t0 + 100 + n_comp * kdur + 50, 2500, stream=20)
        else:
            b.launch("nccl:all_reduce", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                     t0 + 400, t0 + 2000, 300, stream=20)
        if short_kernels:
            for i in range(60):
                b.launch("aten::add_", "void at::native::vectorized_elementwise_kernel<4>(int, float*)",
                         t0 + 500 + i * 9, t0 + 3000 + i * 20, 2, stream=8, runtime_dur=7)
        if launch_bound:
            for i in range(100):
                b.launch("aten::add_", "void at::native::vectorized_elementwise_kernel<4>(int, float*)",
                         t0 + 8910 + i * 9, t0 + 8918 + i * 9, 2)
        copy = "Memcpy HtoD (Pageable -> Device)" if pageable else "Memcpy HtoD (Pinned -> Device)"
        b.launch("aten::copy_", copy, t0 + 300, t0 + 50, 400 if pageable else 40, cat="gpu_memcpy",
                 runtime="cudaMemcpyAsync")
        for i in range(10 if syncs else 1):
            ext = b.cpu("aten::item" if syncs else "aten::_local_scalar_dense", t0 + 1200 + i * 30, 20)
            b.runtime("cudaStreamSynchronize", t0 + 1201 + i * 30, 15, ext)
        if alloc_thrash or step == 0:
            for i in range(20 if alloc_thrash else 3):
                ext = b.cpu("aten::empty", t0 + 2000 + i * 40, 30)
                b.runtime("cudaMalloc", t0 + 2001 + i * 40, 25, ext)
                if alloc_thrash:
                    b.runtime("cudaFree", t0 + 2030 + i * 40, 5, ext)
    return b


def stall_trace(rank: int = 0, *, free_calls: int = 12, short_kernels: bool = False) -> Builder:
    """4 steps of 10 ms where ``free_calls`` cudaFree calls (t0+4000 us on, 25 us each) drain the GPU:
    10 kernels run until t0+4100, the next 5 start at t0+7000, so each step has ~4 ms of GPU idle,
    2.9 ms of it in a gap that begins inside a cudaFree. ``short_kernels`` adds 60 launch-bound kernels."""
    b = Builder(rank)
    for step in range(4):
        t0 = 1_000_000 + step * STEP_US
        b.cpu(f"ProfilerStep#{step + 1}", t0, STEP_US - 1, cat="user_annotation")
        for i in range(10):
            b.launch("aten::mm", "ampere_sgemm_128x64_nn", t0 + 10 + i * 12, t0 + 100 + i * 400, 400)
        for i in range(free_calls):
            ext = b.cpu("aten::empty", t0 + 4000 + i * 26, 26)
            b.runtime("cudaFree", t0 + 4000 + i * 26, 25, ext)
        for i in range(5):
            b.launch("aten::mm", "ampere_sgemm_128x64_nn", t0 + 4400 + i * 12, t0 + 7000 + i * 400, 400)
        if short_kernels:
            for i in range(60):
                b.launch("aten::add_", "void at::native::vectorized_elementwise_kernel<4>(int, float*)",
                         t0 + 9100 + i * 14, t0 + 9110 + i * 14, 2, stream=8, runtime_dur=10)
    return b
