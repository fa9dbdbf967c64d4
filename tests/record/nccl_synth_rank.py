"""One rank of a synthetic NCCL job, launched by torchrun: real steps, synthetic Flight Recorder.

    python nccl_synth_rank.py TRUTH.json [--straggler R --extra-ms 20] [--steps 120] [--step-ms 0]

torch.distributed is not initialised: RANK and WORLD_SIZE say which rank of which world this is.
Every rank simulates the same job (`tests/training/fr_synth.py`, same seed) and keeps its own rank's
GPU timeline: each step sleeps the simulated step time (scaled so that it lasts `--step-ms` when
given), and once the step is over its collectives are released into this rank's Flight Recorder
ring, created now (unix ns, after the first step), with their GPU durations scaled alike. The real
Flight Recorder poller (`gpu_collectives.launch`) reads that ring, so the collective time reaches
the exporter exactly as an NCCL job's would. Rank 0 writes the truth as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # `tests.training.fr_synth` from any cwd

from otel_gpu import training as otg  # noqa: E402
from otel_gpu.training import gpu_collectives, session  # noqa: E402
from tests.training import fr_synth  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("truth")
    ap.add_argument("--straggler", type=int, default=-1, help="the late rank (-1: none)")
    ap.add_argument("--extra-ms", type=float, default=0.0, help="its extra compute per step (after scaling)")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--step-ms", type=float, default=0.0, help="scale the job so a step lasts about this (0: as simulated)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    base = fr_synth.Job(ranks=world, steps=1)
    plain_step = sum(base.compute_s) + sum(base.comm_s)
    scale = a.step_ms / 1000 / plain_step if a.step_ms > 0 else 1.0
    straggler = a.straggler if 0 <= a.straggler < world else None
    job = fr_synth.Job(ranks=world, steps=a.steps, straggler=straggler,
                       extra_s=a.extra_ms / 1000 / scale if straggler is not None else 0.0, seed=a.seed)
    res = fr_synth.simulate(job)
    mine = res.entries[rank]
    per_step = len(job.comm_s)

    released: list[dict] = []
    lock = threading.Lock()

    def dump() -> str:
        with lock:
            return fr_synth.dump(released)

    s = session.current()
    assert s is not None, "otel_gpu.training is off in this process"
    sink = s.sink
    gpu_collectives.launch(dump, sink, lambda: sink.first_step_ns, interval_s=0.5)

    coll_s = 0.0
    t0 = time.perf_counter()
    next_end = t0
    for i in range(job.steps):
        with otg.step(samples=32):
            next_end += res.step_s[rank][i] * scale   # on a schedule: sleep overshoot does not add up
            time.sleep(max(0.0, next_end - time.perf_counter()))
        now = time.time_ns()
        batch = []
        for e in mine[i * per_step:(i + 1) * per_step]:
            e = dict(e, time_created_ns=now, duration_ms=e["duration_ms"] * scale)
            coll_s += e["duration_ms"] / 1000
            batch.append(e)
        with lock:
            released.extend(batch)
    wall = time.perf_counter() - t0

    if rank == 0:
        others = [r for r in range(world) if r != straggler]
        coll = {r: sum(res.coll_s[r]) * scale / job.steps for r in range(world)}
        Path(a.truth).write_text(json.dumps({
            "world": world, "steps": job.steps, "straggler": straggler, "extra_s_per_step": a.extra_ms / 1000,
            "scale": scale, "wall_s": wall, "mean_step_s": sum(res.step_s[0]) * scale / job.steps,
            "collective_per_step_s": {str(r): v for r, v in coll.items()},
            "lateness_s": (statistics.median(coll[r] for r in others) - coll[straggler]) if straggler is not None
            else 0.0,
        }, indent=1))
    print(f"rank {rank}/{world}: {job.steps} steps in {wall:.2f} s, {coll_s:.3f} s in synthetic collectives", flush=True)


if __name__ == "__main__":
    main()
