"""DeepSpeed ZeRO-3 on CPU (gloo), a tiny model; 2 ranks by torchrun or the deepspeed launcher under `otel-gpu run`.

No otel-gpu code here: the engine is instrumented through `otel-gpu run`. `--explicit`
calls `otel_gpu.training.deepspeed.instrument(engine)` instead (same result).
"""
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402

CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1000,
}


def main(steps: int, ckpt_dir: str, explicit: bool):
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    # 8 hidden layers: every forward fetches each layer's partitioned parameters (ZeRO-3), so
    # fetch_sub_module holds a real share of the forward for a 50 Hz profile to sample surely
    hidden = [m for _ in range(8) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())]
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), *hidden, torch.nn.Linear(64, 4))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    if explicit:
        from otel_gpu.training import deepspeed as ds_telemetry
        ds_telemetry.instrument(engine)
    for i in range(steps * CONFIG["gradient_accumulation_steps"]):
        x, y = torch.randn(4, 32), torch.randn(4, 4)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if i % 16 == 15:   # several saves: enough checkpoint time for a 50 Hz profile to sample it surely
            engine.save_checkpoint(ckpt_dir, tag=f"step{i + 1}")
    engine.save_checkpoint(ckpt_dir, tag="final")
    print(f"rank {engine.global_rank} finished", flush=True)


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]   # added by the deepspeed launcher
    main(int(argv[0]), argv[1], "--explicit" in argv)
