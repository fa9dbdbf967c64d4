"""A plain PyTorch loop over a GPT-2-style model built from a config, with padded batches and an
attention mask; no otel-gpu code. Prints its own truth as JSON: the non-padding tokens it trained
on and the model FLOPs of its steps as `torch.utils.flop_counter.FlopCounterMode` counts them
(each step's count times its share of non-padding positions: the work on padding left out).

argv: steps [--frozen] (--frozen: every weight but the attention projections frozen, LoRA-style)
"""
import json
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2LMHeadModel

SEQ, BATCH = 24, 4


class Padded(torch.utils.data.Dataset):
    """Rows of random ids whose last (i % 7) positions are padding (mask 0)."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 256, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        mask = torch.ones(SEQ, dtype=torch.long)
        mask[SEQ - i % 7:] = 0 if i % 7 else 1
        return {"input_ids": self.ids[i] * mask, "attention_mask": mask}


def main(steps: int, frozen: bool):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=64, n_layer=4, n_head=4,
                                       bos_token_id=0, eos_token_id=0))
    if frozen:
        for name, p in model.named_parameters():
            p.requires_grad_("attn.c_attn" in name)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    loader = torch.utils.data.DataLoader(Padded(steps * BATCH), batch_size=BATCH)
    tokens, flops = 0, 0.0
    for batch in loader:
        mask = batch["attention_mask"]
        tokens += int(mask.sum())
        with FlopCounterMode(display=False) as counter:
            out = model(input_ids=batch["input_ids"], attention_mask=mask, labels=batch["input_ids"])
            out.loss.backward()
        flops += counter.get_total_flops() * float(mask.sum()) / mask.numel()
        opt.step()
        opt.zero_grad()
    print(json.dumps({"tokens": tokens, "flops": flops, "steps": steps}), flush=True)
    print("finished", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), "--frozen" in sys.argv)
