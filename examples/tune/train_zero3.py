"""A tiny transformer trained with DeepSpeed ZeRO-3: the workload of the tuner's tests, benchmark and docs.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 examples/tune/train_zero3.py --deepspeed ds_config.json

Runs on a CUDA GPU (nccl) where one is visible, else on CPU (gloo); `--device cpu|cuda` or
`DS_ACCELERATOR` chooses. Every tensor (the model, the batches, their random generator) lives on the
device DeepSpeed's engine runs on; fp32, fp16 and bf16 configs run on both. Nothing here knows about otel-gpu: `otel-gpu tune` (like
`otel-gpu run`) instruments the DeepSpeed engine from outside, so step times reach Prometheus.
Rank 0 also prints a tqdm progress bar (`s/it`), which the tuner reads when no Prometheus is given.

`--simulate-hang KEY=VALUE` makes every rank stop making progress after 3 steps when the
config's `zero_optimization.KEY` equals VALUE (as a stuck collective would): a test aid for
the tuner's timeout handling.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
DEVICES = ("auto", "cpu", "cuda")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deepspeed", required=True, metavar="CONFIG", help="DeepSpeed config JSON")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps to run")
    p.add_argument("--hidden", type=int, default=64, help="model width (hidden_size)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=32, help="tokens per sample")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="cuda (nccl) or cpu (gloo); auto: DS_ACCELERATOR if set, else cuda when a GPU is visible")
    p.add_argument("--simulate-hang", metavar="KEY=VALUE", help="hang after 3 steps when the config has this value")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher
    return p.parse_args(argv)


def hang_requested(config: dict, spec: str | None) -> bool:
    if not spec:
        return False
    key, _, value = spec.partition("=")
    return str(config.get("zero_optimization", {}).get(key)) == value


def choose_device(requested: str, accelerator: str | None, cuda_available: bool) -> str:
    """'cpu' or 'cuda' (pure): the flag, else DS_ACCELERATOR, else cuda when a GPU is visible.
    ValueError when they contradict each other or cuda is asked for without a GPU."""
    if accelerator not in (None, "", "cpu", "cuda"):
        raise ValueError(f"DS_ACCELERATOR={accelerator}: this example runs on cpu or cuda")
    device = requested if requested != "auto" else (accelerator or ("cuda" if cuda_available else "cpu"))
    if accelerator and accelerator != device:
        raise ValueError(f"--device {device} but DS_ACCELERATOR={accelerator}")
    if device == "cuda" and not cuda_available:
        raise ValueError("--device cuda but torch sees no CUDA device")
    return device


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from torch import nn

    try:
        device = choose_device(args.device, os.environ.get("DS_ACCELERATOR"), torch.cuda.is_available())
    except ValueError as exc:
        print(f"train_zero3.py: {exc}", file=sys.stderr)
        return 2
    os.environ["DS_ACCELERATOR"] = device          # before DeepSpeed picks its accelerator
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", args.local_rank or 0)))
    else:
        torch.set_num_threads(1)
    import deepspeed

    with open(args.deepspeed) as f:
        config = json.load(f)
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    torch.manual_seed(0)

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.hidden)
            layer = nn.TransformerEncoderLayer(args.hidden, nhead=4, dim_feedforward=4 * args.hidden,
                                               batch_first=True, dropout=0.0)
            self.body = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.head = nn.Linear(args.hidden, args.vocab)

        def forward(self, tokens):
            return self.head(self.body(self.embed(tokens)))

    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    rank, micro = engine.global_rank, engine.train_micro_batch_size_per_gpu()
    accum = engine.gradient_accumulation_steps()
    hang = hang_requested(config, args.simulate_hang)
    bar = None
    if rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=args.steps, file=sys.stdout, mininterval=0, ascii=True, dynamic_ncols=False)
    if engine.device.type != device:
        raise RuntimeError(f"DeepSpeed placed the engine on {engine.device}, expected {device}")
    # the generator lives on the batches' device: torch.randint on CUDA refuses a CPU generator
    gen = torch.Generator(device=engine.device).manual_seed(rank)
    for step in range(args.steps):
        if hang and step == 3:
            while True:      # a stuck collective: alive, no progress
                time.sleep(1)
        for _ in range(accum):
            tokens = torch.randint(0, args.vocab, (micro, args.seq), generator=gen, device=engine.device)
            logits = engine(tokens)
            loss = nn.functional.cross_entropy(logits.view(-1, args.vocab), tokens.view(-1))
            engine.backward(loss)
            engine.step()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    print(f"rank {rank} finished {args.steps} steps on {engine.device}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
