"""A DDP job whose batches come from its own generator (no DataLoader), with no otel-gpu code.

    torchrun --nproc_per_node 2 own_iterator.py TRUTH_DIR --steps N --mode sleep|cpu --seed S

The generator takes time of its own making: `sleep` waits, `cpu` computes (a Python loop and a
tensor reduction), an amount this script picks per rank from the seed. The script measures its
own truth and writes it to TRUTH_DIR/truth<rank>.json: the seconds spent getting batches from the
generator and the seconds the loop ran, both from the end of the first optimizer step to the end of
the last (the first iteration, with its one-off set-up, left out), and their ratio.
"""
import argparse
import json
import os
import random
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("truth_dir")
p.add_argument("--steps", type=int, default=150)
p.add_argument("--mode", choices=("sleep", "cpu"), default="sleep")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--hidden", type=int, default=512)
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
rng = random.Random(args.seed)   # the same draws on every rank
# how much work each batch takes to make: different in each run and on each rank (which rank makes
# batches more slowly is drawn too)
base, extra, slower = rng.uniform(8.0, 16.0), rng.uniform(4.0, 14.0), rng.randrange(dist.get_world_size())
amount_ms = base + (extra if rank == slower else 0.0)


def batches(n: int):
    """The user's own batch source: makes each batch by hand."""
    g = torch.Generator().manual_seed(rank)
    for _ in range(n):
        if args.mode == "sleep":
            time.sleep(amount_ms / 1000)
        else:   # real CPU work until the chosen amount of time has gone by
            until = time.perf_counter() + amount_ms / 1000
            acc = 0.0
            while time.perf_counter() < until:
                acc += sum(i * i for i in range(200)) * 1e-9
                acc += float(torch.randn(64, 64, generator=g).abs().mean())
        yield torch.randn(32, args.hidden, generator=g), torch.randn(32, 8, generator=g)


model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.hidden),
    torch.nn.ReLU(), torch.nn.Linear(args.hidden, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.001)

it = batches(args.steps)
in_generator = 0.0
first_step_end = last_step_end = None
for i in range(args.steps):
    t0 = time.perf_counter()
    x, y = next(it)
    if first_step_end is not None:
        in_generator += time.perf_counter() - t0
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    last_step_end = time.perf_counter()
    if first_step_end is None:
        first_step_end = last_step_end

loop_s = last_step_end - first_step_end
with open(os.path.join(args.truth_dir, f"truth{rank}.json"), "w") as f:
    json.dump({"rank": str(rank), "mode": args.mode, "amount_ms": amount_ms, "steps": args.steps,
               "generator_s": in_generator, "loop_s": loop_s, "generator_share": in_generator / loop_s}, f)
dist.barrier()
dist.destroy_process_group()
