"""Synthetic multi-rank PyTorch profiler (Kineto) traces of four shapes, made deterministically from a seed.

    python bench/trace_shapes.py OUT [--shape llm|dlrm|cnn|nccl] [--ranks 64] [--seed 0]

Each rank's file is a gzip'd Chrome-trace JSON object as Kineto writes it and HolisticTraceAnalysis
0.5.0 reads it: ``distributedInfo`` (backend, rank, world_size), ``deviceProperties``, then
``traceEvents`` with ``ProfilerStep#N`` CPU ops, nested ``cpu_op`` events, ``cuda_runtime`` launches
(``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cudaStreamWaitEvent``, ``cudaStreamSynchronize``) with
correlation ids, kernels and memory copies on streams carrying the launching op's External id, ``ac2g``
flow events from launch to kernel, metadata and the profiler span. Times are microseconds with
nanosecond decimals. A small queue model places each kernel: it starts when it has been launched and
its stream (and any stream it waits on) is free, so idle time, launch delays and overlap come out as a
real program of that shape gives them. Shapes:

- ``llm``: a transformer training step: per layer fused layer norm, QKV / output / MLP GEMMs, flash
  attention, elementwise kernels, twice the kernels backward; reduce-scatter per gradient bucket on
  the NCCL stream during backward, an all-reduce of the gradient norm, a fused optimizer;
- ``dlrm``: thousands of tiny kernels a step (embedding lookups per table, permutes, elementwise),
  all-to-all of the pooled embeddings forward and backward, small MLP GEMMs, per-table optimizer;
- ``cnn``: convolutions (implicit GEMM), batch norm and ReLU per layer, fewer and longer kernels,
  DDP all-reduce buckets overlapping backward;
- ``nccl``: communication-dominated FSDP: an all-gather before every layer forward and backward that
  the compute stream waits on, a reduce-scatter per layer backward, short compute.

Every step ends with ``.item()`` (a 4-byte copy to the host and a stream synchronize). One rank in
eight runs its compute a little slower (a straggler for the cross-rank analyses).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random

SHAPES = ("llm", "dlrm", "cnn", "nccl")
COMPUTE, COMM, COPY = 7, 20, 24  # stream ids as PyTorch gets them: default compute, NCCL, side copy
_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
_ELEM = "void at::native::vectorized_elementwise_kernel<4, at::native::{}<c10::BFloat16>, at::detail::Array<char*, {}> >" \
        "(int, at::native::{}<c10::BFloat16>, at::detail::Array<char*, {}>)"


_INNER = {"aten::linear": "aten::addmm", "aten::layer_norm": "aten::native_layer_norm", "aten::mul": "aten::mul_",
          "aten::cross_entropy_loss": "aten::_log_softmax", "aten::cudnn_convolution": "aten::_convolution",
          "aten::cudnn_batch_norm": "aten::_batch_norm_impl_index", "aten::copy_": "aten::_to_copy",
          "aten::binary_cross_entropy_with_logits": "aten::sigmoid", "aten::relu": "aten::clamp_min"}


_HELPERS = ("aten::empty", "aten::view", "aten::as_strided", "aten::result_type", "aten::t", "aten::reshape",
            "aten::empty_like", "aten::detach")
_QUERIES = ("cudaStreamIsCapturing", "cudaStreamGetPriority", "cudaFuncSetAttribute")


def _nothing() -> None:
    pass


def _elem(functor: str, n: int = 3) -> str:
    return _ELEM.format(functor, n, functor, n)


def _nccl(coll: str, dtype: str = "bf16") -> str:
    return f"ncclDevKernel_{coll}_RING_LL(ncclDevComm*, unsigned long, ncclWork*)" if coll != "SendRecv" else \
        "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


class _Rank:
    """One rank's program run through a queue model: a CPU clock per thread, a free time per stream."""

    def __init__(self, rank: int, world: int, rng: random.Random, slow: float):
        self.rank, self.world, self.rng, self.slow = rank, world, rng, slow
        self.pid = 1000 + rank
        self.main, self.bwd = self.pid, self.pid + 7
        self.t = 1_700_000_000_000.0 + rng.uniform(0, 50)
        self.free = {COMPUTE: self.t, COMM: self.t, COPY: self.t}
        self.cpu: list[dict] = []
        self.gpu: list[dict] = []
        self.flows: list[dict] = []
        self.ext = 1
        self.corr = 100_000 * (rank + 1)
        self.stack: list[int] = []

    def _ts(self, x: float) -> float:
        return round(x, 3)

    def _next_ext(self) -> int:
        self.ext += 1
        return self.ext

    def op(self, name: str, body, tid: int | None = None, cat: str = "cpu_op", pre=(1.0, 4.0), post=(0.5, 2.0)):
        """A CPU op around ``body()`` (which launches or nests), as Kineto records it."""
        tid = tid or self.main
        ext = self._next_ext()
        start = self.t
        self.t += self.rng.uniform(*pre)
        self.stack.append(ext)
        body()
        self.stack.pop()
        self.t += self.rng.uniform(*post)
        self.cpu.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid, "ts": self._ts(start),
                         "dur": self._ts(self.t - start), "args": {"External id": ext, "Record function id": ext,
                                                                   "Ev Idx": len(self.cpu)}})
        return ext

    def _runtime(self, name: str, tid: int, dur: float, corr: int | None, cbid: int) -> float:
        start = self.t
        args = {"External id": self.stack[-1] if self.stack else 0, "cbid": cbid}
        if corr is not None:
            args["correlation"] = corr
        self.cpu.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid, "tid": tid,
                         "ts": self._ts(start), "dur": self._ts(dur), "args": args})
        self.t = start + dur
        return start

    def launch(self, kernel: str, dur: float, stream: int = COMPUTE, tid: int | None = None, after: float = 0.0,
               cat: str = "kernel", nbytes: int = 0):
        """A kernel (or copy/memset: ``cat``) launched now on ``stream``, not before ``after`` (an event
        it waits on); returns its end time."""
        tid = tid or self.main
        self.corr += 1
        corr = self.corr
        api = {"kernel": ("cudaLaunchKernel", 211), "gpu_memcpy": ("cudaMemcpyAsync", 51),
               "gpu_memset": ("cudaMemsetAsync", 55)}[cat]
        if self.rng.random() < 0.3:  # runtime calls that launch nothing (they get a correlation id too)
            self.corr += 1
            self._runtime(self.rng.choice(_QUERIES), tid, self.rng.uniform(0.5, 2.0), self.corr, 0)
            self.corr += 1
            corr = self.corr
        rt_dur = self.rng.uniform(2.5, 6.0) if cat == "kernel" else self.rng.uniform(4.0, 9.0)
        start = self._runtime(api[0], tid, rt_dur, corr, api[1])
        dur = dur * (self.slow if stream == COMPUTE else 1.0) * self.rng.uniform(0.93, 1.07)
        k0 = max(start + self.rng.uniform(3.0, 6.0), self.free[stream], after)
        self.free[stream] = k0 + dur
        args = {"External id": self.stack[-1] if self.stack else 0, "queued": 0, "device": self.rank % 8,
                "context": 1, "stream": stream, "correlation": corr}
        if cat == "kernel":
            args.update({"registers per thread": 64, "shared memory": 0, "blocks per SM": 1.2, "warps per SM": 9.6,
                         "grid": [132, 1, 1], "block": [256, 1, 1], "est. achieved occupancy %": 25})
        else:
            args.update({"bytes": nbytes, "memory bandwidth (GB/s)": nbytes / (dur * 1000.0)})
        self.gpu.append({"ph": "X", "cat": cat, "name": kernel, "pid": self.rank % 8, "tid": stream,
                         "ts": self._ts(k0), "dur": self._ts(dur), "args": args})
        self.flows.append({"ph": "s", "id": corr, "pid": self.pid, "tid": tid, "ts": self._ts(start),
                           "cat": "ac2g", "name": "ac2g"})
        self.flows.append({"ph": "f", "id": corr, "pid": self.pid, "tid": tid, "ts": self._ts(k0),
                           "cat": "ac2g", "name": "ac2g", "bp": "e"})
        return k0 + dur

    def kernel_op(self, name: str, kernels, tid: int | None = None, stream: int = COMPUTE, after: float = 0.0):
        """An ATen op (with its inner op) launching ``kernels`` [(name, us)]; returns the last kernel's end."""
        end = [0.0]

        def launches():
            for _ in range(self.rng.randint(1, 3)):  # allocation and view ops: CPU only, as in real traces
                self.op(self.rng.choice(_HELPERS), _nothing, tid, pre=(0.3, 1.5), post=(0.2, 0.8))
            for k, d in kernels:
                end[0] = self.launch(k, d, stream, tid, after)
        inner = _INNER.get(name)
        self.op(name, (lambda: self.op(inner, launches, tid)) if inner else launches, tid)
        return end[0]

    def accumulate_grad(self, params: int) -> None:
        """Autograd's AccumulateGrad of ``params`` parameters (DDP/FSDP hooks): CPU ops only."""
        for _ in range(params):
            self.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", lambda: self.op(
                "torch::autograd::AccumulateGrad", lambda: self.op("aten::detach", lambda: self.op(
                    "detach", _nothing, self.bwd), self.bwd), self.bwd), self.bwd)

    def wait_event(self, tid: int | None = None) -> None:
        """cudaEventRecord + cudaStreamWaitEvent, as PyTorch issues them around a collective."""
        self._runtime("cudaEventRecord", tid or self.main, self.rng.uniform(1, 3), None, 166)
        self._runtime("cudaStreamWaitEvent", tid or self.main, self.rng.uniform(1, 3), None, 147)

    def collective(self, coll: str, label: str, us: float, tid: int | None = None, after: float | None = None):
        """A c10d collective: user annotation, record_param_comms, the NCCL kernel on the comm stream,
        waiting for the compute stream as it stands (``after``: instead, this time); returns its end."""
        end = [0.0]
        ready = self.free[COMPUTE] if after is None else after

        def body():
            self.wait_event(tid)
            end[0] = self.kernel_op("record_param_comms", [(_nccl(coll), us)], tid, COMM, ready)
        self.op(f"nccl:{label}", body, tid, cat="user_annotation")
        return end[0]

    def item(self) -> None:
        """``loss.item()``: a 4-byte copy to the host, then the CPU waits for the streams."""
        def body():
            def inner():
                self.launch("Memcpy DtoH (Device -> Pageable)", 1.5, COMPUTE, cat="gpu_memcpy", nbytes=4)
                wait = max(self.free.values()) - self.t + self.rng.uniform(2, 5)
                self._runtime("cudaStreamSynchronize", self.main, max(wait, 2.0), None, 131)
            self.op("aten::_local_scalar_dense", inner)
        self.op("aten::item", body)

    def step(self, n: int, program) -> None:
        self.op(f"ProfilerStep#{n}", lambda: (program(self), self.item()), pre=(20, 40), post=(30, 60))
        self.t += self.rng.uniform(100, 300)  # dataloader and Python between steps

    def document(self) -> dict:
        meta = [{"name": "process_name", "ph": "M", "ts": self._ts(self.cpu[0]["ts"]), "pid": self.pid, "tid": 0,
                 "args": {"name": "python3"}},
                {"name": "thread_name", "ph": "M", "ts": self._ts(self.cpu[0]["ts"]), "pid": self.rank % 8,
                 "tid": COMPUTE, "args": {"name": f"stream {COMPUTE} "}}]
        first = min(e["ts"] for e in self.cpu)
        last = max(e["ts"] + e["dur"] for e in self.cpu + self.gpu)
        span = {"ph": "X", "cat": "Trace", "ts": first, "dur": self._ts(last - first), "pid": "Spans",
                "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}}
        return {"schemaVersion": 1,
                "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world},
                "deviceProperties": [{"id": self.rank % 8, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,
                                      "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
                "traceEvents": self.cpu + self.gpu + self.flows + meta + [span],
                "traceName": f"rank{self.rank}.pt.trace.json", "displayTimeUnit": "ms"}


def _llm(r: _Rank, layers: int = 6) -> None:
    ln, add, gelu = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", \
        _elem("CUDAFunctor_add"), _elem("GeluCUDAKernelImpl", 2)
    for _ in range(layers):
        r.kernel_op("aten::layer_norm", [(ln, 18)])
        r.kernel_op("aten::linear", [(_GEMM, 140)])
        r.kernel_op("aten::_scaled_dot_product_flash_attention", [("flash_fwd_kernel<Flash_fwd_kernel_traits>", 210)])
        r.kernel_op("aten::linear", [(_GEMM, 60)])
        r.kernel_op("aten::add", [(add, 12)])
        r.kernel_op("aten::layer_norm", [(ln, 18)])
        r.kernel_op("aten::linear", [(_GEMM, 230)])
        r.kernel_op("aten::gelu", [(gelu, 30)])
        r.kernel_op("aten::linear", [(_GEMM, 230)])
        r.kernel_op("aten::add", [(add, 12)])
    r.kernel_op("aten::cross_entropy_loss", [("void at::native::cunn_SoftMaxForward<4, float, float>", 90),
                                             ("void at::native::nll_loss_forward_reduce_cuda_kernel_2d<float>", 8)])
    for i in range(layers):
        def bwd_layer():
            for g in (230, 230, 60, 140):
                r.kernel_op("aten::mm", [(_GEMM, g)], r.bwd)
                r.kernel_op("aten::mm", [(_GEMM, g)], r.bwd)
            r.kernel_op("aten::_flash_attention_backward", [("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 480)], r.bwd)
            r.kernel_op("aten::gelu_backward", [(_elem("GeluBackwardCUDAKernelImpl"), 40)], r.bwd)
            r.kernel_op("aten::native_layer_norm_backward", [("layer_norm_grad_input_kernel", 30),
                                                             ("GammaBetaBackwardCUDAKernel", 20)], r.bwd)
        r.op("autograd::engine::evaluate_function: LinearBackward0", bwd_layer, r.bwd)
        r.accumulate_grad(6)
        if i % 2 == 1:
            r.collective("ReduceScatter_Sum_bf16", "reduce_scatter", 520, r.bwd)
    r.collective("AllReduce_Sum_f32", "all_reduce", 45)
    r.kernel_op("Optimizer.step#AdamW.step", [("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 160)] * 4)


def _dlrm(r: _Rank, tables: int = 48, per_table: int = 9) -> None:
    r.kernel_op("aten::copy_", [("Memcpy HtoD (Pinned -> Device)", 12)])
    r.launch("Memcpy HtoD (Pinned -> Device)", 9, COPY, cat="gpu_memcpy", nbytes=262_144)
    for t in range(tables):
        r.kernel_op("fbgemm::permute_2D_sparse_data", [("void fbgemm_gpu::permute_2D_lengths_kernel<int>", 3.0)])
        r.kernel_op("aten::cumsum", [("void at_cuda_detail::cub::DeviceScanKernel<int>", 4.0)])
        r.kernel_op("fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function",
                    [("void fbgemm_gpu::split_embedding_codegen_forward_unweighted_kernel<float, float>", 9.0 + t % 5)])
        for _ in range(per_table - 3):
            r.kernel_op("aten::mul", [(_elem("MulFunctor"), 2.2)])
    r.collective("SendRecv", "all_to_all", 260)
    for g in (90, 60, 30):
        r.kernel_op("aten::addmm", [(_GEMM, g)])
        r.kernel_op("aten::relu", [(_elem("clamp_min_scalar_kernel_impl", 2), 3)])
    r.kernel_op("aten::binary_cross_entropy_with_logits", [(_elem("BCEWithLogits"), 4)])

    def bwd():
        for g in (30, 60, 90):
            r.kernel_op("aten::mm", [(_GEMM, g)], r.bwd)
            r.kernel_op("aten::mm", [(_GEMM, g)], r.bwd)
            r.kernel_op("aten::threshold_backward", [(_elem("threshold_kernel_impl"), 3)], r.bwd)
        r.collective("SendRecv", "all_to_all", 260, r.bwd)
        for t in range(tables):
            r.kernel_op("fbgemm::split_embedding_backward_codegen_rowwise_adagrad",
                        [("void fbgemm_gpu::split_embedding_backward_codegen_rowwise_adagrad_kernel_cta", 11.0 + t % 7),
                         ("void fbgemm_gpu::linearize_index_kernel<long>", 2.5)], r.bwd)
            for _ in range(per_table - 4):
                r.kernel_op("aten::add_", [(_elem("CUDAFunctor_add"), 2.0)], r.bwd)
    r.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", bwd, r.bwd)
    r.collective("AllReduce_Sum_f32", "all_reduce", 120)
    r.kernel_op("Optimizer.step#SGD.step", [("void at::native::multi_tensor_apply_kernel<FusedSgdMathFunctor>", 20)] * 3)


def _cnn(r: _Rank, layers: int = 20) -> None:
    conv = "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1"
    dgrad = "sm80_xmma_dgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16"
    wgrad = "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16"
    bn = "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>"
    size = [600 - 20 * i for i in range(layers)]
    for i in range(layers):
        r.kernel_op("aten::cudnn_convolution", [(conv, size[i])])
        r.kernel_op("aten::cudnn_batch_norm", [(bn, size[i] / 6)])
        r.kernel_op("aten::relu_", [(_elem("clamp_min_scalar_kernel_impl", 2), size[i] / 10)])
    r.kernel_op("aten::linear", [(_GEMM, 80)])
    for i in reversed(range(layers)):
        def bwd_layer(i=i):
            r.kernel_op("aten::threshold_backward", [(_elem("threshold_kernel_impl"), size[i] / 10)], r.bwd)
            r.kernel_op("aten::cudnn_batch_norm_backward", [("void cudnn::bn_bw_1C11_kernel_new<float, float>",
                                                            size[i] / 4)], r.bwd)
            r.kernel_op("aten::convolution_backward", [(dgrad, size[i] * 1.1), (wgrad, size[i] * 0.9)], r.bwd)
        r.op("autograd::engine::evaluate_function: ConvolutionBackward0", bwd_layer, r.bwd)
        r.accumulate_grad(3)
        if i % 5 == 0:
            r.collective("AllReduce_Sum_f32", "all_reduce", 900, r.bwd)
    r.kernel_op("Optimizer.step#SGD.step", [("void at::native::multi_tensor_apply_kernel<FusedSgdMathFunctor>", 140)] * 2)


def _nccl_heavy(r: _Rank, layers: int = 16) -> None:
    for _ in range(layers):
        got = r.collective("AllGather", "_allgather_base", 900)
        r.kernel_op("aten::linear", [(_GEMM, 150)], after=got)
        r.kernel_op("aten::gelu", [(_elem("GeluCUDAKernelImpl", 2), 20)])
        r.kernel_op("aten::linear", [(_GEMM, 150)])
    for _ in range(layers):
        def bwd_layer():
            got = r.collective("AllGather", "_allgather_base", 900, r.bwd, after=0.0)
            for _ in range(4):
                r.kernel_op("aten::mm", [(_GEMM, 150)], r.bwd, after=got)
            r.collective("ReduceScatter_Sum_bf16", "_reduce_scatter_base", 1100, r.bwd)
        r.op("autograd::engine::evaluate_function: LinearBackward0", bwd_layer, r.bwd)
    r.collective("AllReduce_Sum_f32", "all_reduce", 40)
    r.kernel_op("Optimizer.step#AdamW.step", [("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 90)] * 2)


PROGRAMS = {"llm": _llm, "dlrm": _dlrm, "cnn": _cnn, "nccl": _nccl_heavy}


def rank_document(shape: str, rank: int, world: int, seed: int = 0, steps: int = 4) -> dict:
    """One rank's trace document (a dict) of ``shape``; the same arguments give the same document."""
    rng = random.Random(f"{shape}/{seed}/{rank}")
    r = _Rank(rank, world, rng, slow=1.15 if rank % 8 == 5 else 1.0)
    for n in range(steps):
        r.step(10 + n, PROGRAMS[shape])
    return r.document()


def write_set(shape: str, out: str, ranks: int = 64, seed: int = 0, steps: int = 4) -> str:
    """Write ``ranks`` files ``rank{r}.pt.trace.json.gz`` of ``shape`` under ``out``; returns ``out``."""
    if shape not in PROGRAMS:
        raise ValueError(f"unknown shape {shape!r} (one of {', '.join(SHAPES)})")
    os.makedirs(out, exist_ok=True)
    for rank in range(ranks):
        doc = rank_document(shape, rank, ranks, seed, steps)
        with gzip.GzipFile(os.path.join(out, f"rank{rank}.pt.trace.json.gz"), "wb", mtime=0) as fh:
            fh.write(json.dumps(doc).encode())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--shape", choices=SHAPES, action="append", help="shape(s) to write (default: all, one folder each)")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4, help="profiler steps per rank (the last one HTA drops)")
    args = ap.parse_args()
    for shape in args.shape or SHAPES:
        print(write_set(shape, os.path.join(args.out, shape), args.ranks, args.seed, args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
