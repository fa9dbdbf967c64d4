"""A small two-rank trace set with every CUDA sync kind, deterministic (the shared sets have none).

    python tests/data/hta_extra/make_sync_set.py tests/data/hta_extra/crafted/sync_2stream

Each of 4 ProfilerSteps (10 ms): 8 matmuls on stream 7; ``cudaEventRecord`` on stream 7, then
``cudaStreamWaitEvent`` makes stream 20 wait for it (a GPU-side "Stream Wait Event") before an NCCL
all-reduce; the CPU waits for the all-reduce with ``cudaEventSynchronize`` ("Event Sync"), launches 3
more matmuls on stream 8, waits with ``cudaStreamSynchronize`` ("Stream Sync"), launches one kernel on an idle
stream and ends with ``cudaDeviceSynchronize`` ("Context Sync"). The all-reduce lasts 800 us on
rank 0 and 2500 us on rank 1, so the two ranks' critical paths differ.
"""
import gzip
import json
import os
import sys

STEP_US = 10_000


class Trace:
    def __init__(self, rank: int):
        self.rank = rank
        self.events: list[dict] = []
        self.corr = 100
        self.ext = 1

    def op(self, name: str, ts: int, dur: int, cat: str = "cpu_op") -> int:
        self.ext += 1
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 10, "tid": 11, "ts": ts, "dur": dur,
                            "args": {"External id": self.ext}})
        return self.ext

    def runtime(self, name: str, ts: int, dur: int, ext: int) -> int:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 10, "tid": 11, "ts": ts,
                            "dur": dur, "args": {"External id": ext, "correlation": self.corr}})
        return self.corr

    def gpu(self, name: str, cat: str, ts: int, dur: int, stream: int, corr: int, ext: int, **args) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream if stream >= 0 else 0,
                            "ts": ts, "dur": dur, "args": {"External id": ext, "device": 0, "stream": stream,
                                                           "correlation": corr, **args}})

    def launch(self, op: str, kernel: str, cpu_ts: int, gpu_ts: int, dur: int, stream: int = 7) -> None:
        ext = self.op(op, cpu_ts, 8)
        corr = self.runtime("cudaLaunchKernel", cpu_ts + 1, 6, ext)
        self.gpu(kernel, "kernel", gpu_ts, dur, stream, corr, ext)

    def sync(self, op: str, call: str, kind: str, ts: int, dur: int, stream: int, **wait) -> int:
        ext = self.op(op, ts, dur + 2)
        corr = self.runtime(call, ts + 1, dur, ext)
        self.gpu(kind, "cuda_sync", ts + 2, dur - 2, stream, corr, ext, **wait)
        return corr

    def record(self, ts: int) -> int:
        ext = self.op("record_event", ts, 6)
        return self.runtime("cudaEventRecord", ts + 1, 4, ext)


def build(rank: int) -> dict:
    t = Trace(rank)
    nccl = 800 if rank == 0 else 2500
    for step in range(4):
        t0 = 1_000_000 + step * STEP_US
        t.op(f"ProfilerStep#{step + 1}", t0, STEP_US - 1, cat="user_annotation")
        for i in range(8):
            t.launch("aten::mm", "ampere_sgemm_128x64_nn", t0 + 10 + i * 12, t0 + 100 + i * 400, 400)
        rec = t.record(t0 + 120)
        t.sync("wait_stream", "cudaStreamWaitEvent", "Stream Wait Event", t0 + 130, 4, 20,
               wait_on_stream=7, wait_on_cuda_event_record_corr_id=rec)
        t.launch("nccl:all_reduce", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                 t0 + 140, t0 + 3310, nccl, stream=20)
        rec2 = t.record(t0 + 160)
        done = t0 + 3310 + nccl
        t.sync("aten::item", "cudaEventSynchronize", "Event Sync", t0 + 200, done + 10 - (t0 + 200), -1,
               wait_on_stream=20, wait_on_cuda_event_record_corr_id=rec2)
        c = done + 20
        for i in range(3):
            t.launch("aten::mm", "ampere_sgemm_128x64_nn", c + i * 12, c + 70 + i * 300, 300, stream=8)
        t.sync("aten::_local_scalar_dense", "cudaStreamSynchronize", "Stream Sync", c + 60, 70 + 900 + 20, 8)
        c2 = c + 60 + 1000
        t.launch("aten::add_", "vectorized_elementwise_kernel", c2, c2 + 12, 100, stream=9)
        t.sync("synchronize", "cudaDeviceSynchronize", "Context Sync", c2 + 20, 100, -1)
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "traceEvents": t.events}


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for rank in (0, 1):
        with gzip.GzipFile(os.path.join(out, f"rank{rank}.json.gz"), "wb", mtime=0) as fh:
            fh.write(json.dumps(build(rank), indent=0).encode())


if __name__ == "__main__":
    main()
