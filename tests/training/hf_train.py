"""A tiny Hugging Face model built from a config (no download), trained by `Trainer` on CPU.

`--explicit`: instrument with `otel_gpu.training.hf.instrument(trainer)`; otherwise rely on
`otel-gpu run` (zero code change).
"""
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 128, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        mask = torch.ones_like(self.ids[i])
        mask[-3:] = 0   # every row padded at its last 3 positions: tokens are 13 per row whatever the order
        return {"input_ids": self.ids[i], "attention_mask": mask, "labels": self.ids[i]}


def main(out_dir: str, explicit: bool):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=out_dir, max_steps=8, per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, save_strategy="steps", save_steps=4,
                             eval_strategy="steps", eval_steps=4, logging_steps=100, report_to=[],
                             use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(64, 16), eval_dataset=RandomTokens(8, 16))
    if explicit:
        from otel_gpu.training import hf
        hf.instrument(trainer)
    trainer.train()
    print("finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], "--explicit" in sys.argv)
