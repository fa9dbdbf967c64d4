"""Synthetic NCCL jobs whose truth is known: each rank's GPU timeline, step by step, and the Flight
Recorder entries every rank would hold (format "2.10": GPU-timed `duration_ms`, retired).

Per step and rank: compute segments on the compute stream, each followed by a collective on the
NCCL stream. A collective starts on a rank when its input is computed and the NCCL stream is free,
and ends `comm_s` after the last rank arrived; its GPU time on a rank includes the wait for the last
one. Without overlap the compute stream waits for each collective; with overlap it goes on and only
the step's end waits. A straggler does `extra_s` more compute in segment `place` every step.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from otel_gpu.diagnose.model import RankStats, Window

FR_NAMES = {"all_gather": "nccl:_all_gather_base", "reduce_scatter": "nccl:_reduce_scatter_base",
            "all_reduce": "nccl:all_reduce", "broadcast": "nccl:broadcast"}


@dataclass
class Job:
    ranks: int = 2
    steps: int = 40
    compute_s: tuple[float, ...] = (0.010, 0.020, 0.020, 0.005)   # segments; one collective after each but the last
    comm_s: tuple[float, ...] = (0.004, 0.004, 0.006)
    kinds: tuple[str, ...] = ("all_gather", "all_gather", "reduce_scatter")
    overlap: bool = False
    straggler: int | None = None
    extra_s: float = 0.0
    place: int = 0
    jitter_s: float = 0.0003
    seed: int = 0
    t0_ns: int = 1_790_000_000_000_000_000


@dataclass
class Result:
    entries: dict[int, list[dict]] = field(default_factory=dict)   # rank -> Flight Recorder entries
    step_s: dict[int, list[float]] = field(default_factory=dict)   # rank -> each step's wall time
    coll_s: dict[int, list[float]] = field(default_factory=dict)   # rank -> GPU collective seconds per step


def simulate(job: Job) -> Result:
    rnd = random.Random(job.seed)
    n, res = job.ranks, Result()
    c = [0.0] * n          # compute stream time per rank
    m = [0.0] * n          # NCCL stream free at
    rid = [0] * n
    seq = 0
    for r in range(n):
        res.entries[r], res.step_s[r], res.coll_s[r] = [], [], []
    for _ in range(job.steps):
        start = list(c)
        coll = [0.0] * n
        for j, seg in enumerate(job.compute_s):
            for r in range(n):
                c[r] += seg + rnd.uniform(0, job.jitter_s) + (job.extra_s if r == job.straggler and j == job.place else 0.0)
            if j >= len(job.comm_s):
                continue
            arrive = [max(c[r], m[r]) for r in range(n)]
            end = max(arrive) + job.comm_s[j]
            seq += 1
            for r in range(n):
                d = end - arrive[r]
                coll[r] += d
                m[r] = end
                if not job.overlap:
                    c[r] = end
                res.entries[r].append({
                    "record_id": rid[r], "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
                    "p2p_seq_id": 0, "op_id": seq, "profiling_name": FR_NAMES[job.kinds[j]],
                    "time_created_ns": job.t0_ns + int(arrive[r] * 1e9), "duration_ms": d * 1e3,
                    "state": "completed", "retired": True, "is_p2p": False, "timeout_ms": 600000,
                    "input_sizes": [[1024]], "output_sizes": [[1024 * n]], "thread_id": "1", "thread_name": "python"})
                rid[r] += 1
        for r in range(n):
            c[r] = max(c[r], m[r])   # a rank's step ends when its last collective has (no barrier: the next
            res.step_s[r].append(c[r] - start[r])   # step's first collective waits for a late rank)
            res.coll_s[r].append(coll[r])
    return res


def dump(entries: list[dict], ring: int = 2000, version: str = "2.10") -> str:
    """The JSON dump of a ring holding the last `ring` entries."""
    return json.dumps({"version": version, "pg_config": {}, "pg_status": {}, "entries": entries[-ring:]})


def window(res: Result, phases: dict[int, dict[str, float]] | None = None, chunk: int = 5,
           host: str = "node0") -> Window:
    """A diagnosis window of the simulated job, as the recording or PromQL would give it (basis "gpu")."""
    from otel_gpu.training import flight_recorder as fr
    ranks, busy = [], {}
    for r, entries in res.entries.items():
        _, recs = fr.parse(dump(entries, ring=len(entries)))
        by_kind: dict[str, float] = {}
        for x in recs:
            by_kind[x.kind] = by_kind.get(x.kind, 0.0) + x.duration_s
        steps = len(res.step_s[r])
        total = sum(res.step_s[r])
        ranks.append(RankStats(rank=str(r), host=host, steps=steps, step_time_s=total, step_count=steps,
                               phases=dict((phases or {}).get(r, {})), samples=steps // chunk,
                               collective_s=sum(by_kind.values()), collective_by_phase={"": sum(by_kind.values())},
                               collective_by_kind=by_kind, collective_basis="gpu"))
        busy[str(r)] = [(sum(res.step_s[r][i:i + chunk]) - sum(res.coll_s[r][i:i + chunk])) / chunk
                        for i in range(0, steps - chunk + 1, chunk)]
    w = Window(job="synthetic", start=0.0, end=sum(res.step_s[0]), ranks=ranks)
    w.busy = busy
    return w
