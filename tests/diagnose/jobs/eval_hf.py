"""A tiny Hugging Face model (built from a config, no download) trained by `Trainer` on CPU with
evaluation every few steps (eval_strategy="steps"), as a user writes it (no otel-gpu import).

    torchrun --nproc_per_node 2 eval_hf.py TRUTH.json OUT_DIR --steps 45 --eval-steps 10 --eval-samples 512

Each rank writes what it measured with its own callback and its own `evaluate` timing: the seconds
from the first step's start to the end of training (the Trainer evaluates once more after the last
step), the seconds spent in `evaluate` (every pass lies between steps), their ratio, the steps and
the passes.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("truth")
p.add_argument("out_dir")
p.add_argument("--steps", type=int, default=45)
p.add_argument("--eval-steps", type=int, default=10)
p.add_argument("--eval-samples", type=int, default=512)
a = p.parse_args()


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 128, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Clock(TrainerCallback):
    """The user's own stopwatch: first step start, steps, their own time."""

    def __init__(self):
        self.first = self.began = None
        self.steps, self.step_s = 0, 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.began = time.perf_counter()
        if self.first is None:
            self.first = self.began

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1
        self.step_s += time.perf_counter() - self.began


class TimedTrainer(Trainer):
    """A Trainer that times its own evaluation passes."""

    eval_s, passes = 0.0, 0

    def evaluate(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self.eval_s += time.perf_counter() - t
            self.passes += 1


torch.set_num_threads(1)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                   bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=a.out_dir, max_steps=a.steps, per_device_train_batch_size=8,
                         per_device_eval_batch_size=16, eval_strategy="steps", eval_steps=a.eval_steps,
                         save_strategy="no", logging_steps=1000, report_to=[], use_cpu=True,
                         dataloader_num_workers=0, disable_tqdm=True)
clock = Clock()
trainer = TimedTrainer(model=model, args=args, train_dataset=RandomTokens(a.steps * 16, 32, 0),
                       eval_dataset=RandomTokens(a.eval_samples, 64, 1), callbacks=[clock])
trainer.train()
wall = time.perf_counter() - clock.first
rank = dist.get_rank() if dist.is_initialized() else 0
with open(a.truth.format(rank=rank), "w") as fh:
    json.dump({"rank": str(rank), "steps": clock.steps, "passes": trainer.passes, "wall_s": wall,
               "eval_s": trainer.eval_s, "eval_share": trainer.eval_s / wall,
               "train_step_s": clock.step_s / clock.steps}, fh)
print("finished", flush=True)
