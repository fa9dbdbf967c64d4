"""A DeepSpeed ZeRO-3 training loop on CPU (gloo), as a user writes it (no otel-gpu import).

    torchrun --nproc_per_node 2 ds_train.py TRUTH.json [--slow-rank 0 --slow-where forward_hook --slow-ms 40]
             [--loader-ms 30] [--ckpt-every 10 --ckpt-dir D]

Every rank saves its ZeRO-3 partition at a checkpoint. Each rank writes what it measured.
"""
import os
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402

from common import Batches, Truth, log_metrics, parse_args  # noqa: E402


def config(batch: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": 3, "overlap_comm": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 100000,
    }


def main():
    a = parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    truth = Truth(a)
    h = a.hidden
    net = torch.nn.Sequential(torch.nn.Linear(256, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                              torch.nn.Linear(h, 16))
    if truth.slow_here("forward_hook"):
        net[2].register_forward_pre_hook(lambda module, args: truth.sleep())
    engine, optimizer, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config(a.batch))
    if truth.slow_here("optimizer"):   # the torch optimizer ZeRO-3 steps inside engine.step()
        optimizer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: truth.sleep())
    loader = torch.utils.data.DataLoader(Batches(a.steps, a.batch, 256, truth.loader_ms(), truth.s), batch_size=None)
    torch.distributed.barrier()
    truth.start()
    it = iter(loader)
    for step in range(a.steps):
        t = time.perf_counter()
        x, y = next(it)
        truth.s["data_wait"] += time.perf_counter() - t
        if truth.slow_here("before_forward"):
            truth.sleep()
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        log_metrics(truth, loss)
        if a.ckpt_every and (step + 1) % a.ckpt_every == 0 and step + 1 < a.steps:
            t = time.perf_counter()
            engine.save_checkpoint(a.ckpt_dir, tag=f"step{step + 1}")
            truth.s["checkpoint"] += time.perf_counter() - t
            truth.saves += 1
    truth.write()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
