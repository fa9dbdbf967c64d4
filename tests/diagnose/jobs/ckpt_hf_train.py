"""A Hugging Face Trainer job that saves checkpoints, as a user writes it (no otel-gpu import).

    torchrun --nproc_per_node 2 ckpt_hf_train.py TRUTH.json --saver R [--steps 160 --save-steps 20 --blob-mb 128]

The Trainer writes its own checkpoint every `--save-steps` on rank 0 (a tiny model: milliseconds). The
user's own Trainer subclass also exports a large copy (`--blob-mb` MB) in its save, on rank `--saver`:
on rank 0 beside the Trainer's files, on rank 1 alone (an export that only the rank holding the data
writes). The other rank goes on to the next batch and waits for the saver in the Trainer's token-count
all-gather.
Each rank writes what it measured with its own clock: time saving (the Trainer's `_save_checkpoint`
plus the export), saves, time in `get_batch_samples` (its batch fetch, the wait included), time in
`training_step` (forward and backward, DDP's all-reduce wait included), wall time: training time, from
its first batch fetch to the end of `train()` (the Trainer's set-up before it, DDP wrapping and loaders,
is not training; `train_call_s` is the whole call).
"""
import argparse
import json
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 128, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Clock:
    def __init__(self):
        self.s = {"checkpoint": 0.0, "batch_fetch": 0.0, "compute": 0.0}
        self.saves = 0
        self.first_fetch: float | None = None   # perf_counter at the first batch fetch: training begins


class TimedTrainer(Trainer):
    """The user's own subclass: its save also writes an export on one rank; it times what it cares about."""

    clock: Clock
    export: torch.Tensor | None = None
    export_path = "export.pt"

    def _save_checkpoint(self, model, trial):
        t = time.perf_counter()
        try:
            out = super()._save_checkpoint(model, trial)
            if self.export is not None:
                torch.save({"blob": self.export, "step": self.state.global_step}, self.export_path)
            return out
        finally:
            self.clock.s["checkpoint"] += time.perf_counter() - t
            self.clock.saves += 1

    def training_step(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return super().training_step(*args, **kwargs)
        finally:
            self.clock.s["compute"] += time.perf_counter() - t

    def get_batch_samples(self, *args, **kwargs):
        t = time.perf_counter()
        if self.clock.first_fetch is None:
            self.clock.first_fetch = t
        try:
            return super().get_batch_samples(*args, **kwargs)
        finally:
            self.clock.s["batch_fetch"] += time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("truth")
    ap.add_argument("--saver", type=int, default=0)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--save-steps", type=int, default=20)
    ap.add_argument("--blob-mb", type=float, default=128)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = int(os.environ.get("RANK", "0"))
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=os.path.join(a.out, "hf"), max_steps=a.steps, per_device_train_batch_size=8,
                             save_strategy="steps", save_steps=a.save_steps, logging_steps=1000, report_to=[],
                             use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, save_only_model=True,
                             average_tokens_across_devices=True)
    clock = Clock()
    trainer = TimedTrainer(model=model, args=args, train_dataset=RandomTokens(a.steps * 16 + 64, 24))
    trainer.clock = clock
    if rank == a.saver:
        trainer.export = torch.randn(int(a.blob_mb * 2**20 / 4))
        trainer.export_path = os.path.join(a.out, "export.pt")
    t0, unix0 = time.perf_counter(), time.time()
    trainer.train()
    end = time.perf_counter()
    wall = end - clock.first_fetch   # training time: the Trainer's set-up before its first batch left out
    out = {"rank": rank, "saver": a.saver, "wall_s": wall, "train_call_s": end - t0,
           "unix_start": unix0 + (clock.first_fetch - t0), "saves": clock.saves,
           "steps": a.steps, **{f"{k}_s": v for k, v in clock.s.items()},
           **{f"{k}_share": v / wall for k, v in clock.s.items()}}
    with open(a.truth.format(rank=rank), "w") as fh:
        json.dump(out, fh)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
