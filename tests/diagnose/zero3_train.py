"""DeepSpeed ZeRO-3 on CPU (gloo) with tiny buckets: every parameter fetch and gradient reduce is a
small collective. Launched with 2 ranks by torchrun under `otel-gpu run` (metrics and profiles)."""
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402

TINY = 2_000   # elements: far below DeepSpeed's defaults (5e7 prefetch, 5e8 reduce)
CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": TINY,
                          "stage3_prefetch_bucket_size": TINY, "stage3_max_live_parameters": TINY,
                          "overlap_comm": False},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 100000,
}


def main(steps: int):
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(128, 4))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    for _ in range(steps):
        x, y = torch.randn(8, 128), torch.randn(8, 4)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    print(f"rank {engine.global_rank} finished", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
