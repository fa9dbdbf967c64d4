"""A plain PyTorch loop over an `nn.TransformerEncoder` language model (no Hugging Face config), with
dynamically padded batches, an attention mask and gradient accumulation over 2 micro-batches; no
otel-gpu code. `main` returns its own truth: the
non-padding tokens it trained on and the model FLOPs of its steps as `FlopCounterMode` counts them with
the math attention kernel (each step's count times its share of non-padding positions).
"""
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

D, LAYERS, VOCAB, BATCH, ACCUMULATE = 64, 2, 256, 4, 2


class Rows(torch.utils.data.Dataset):
    """Sequences of 5 to 28 ids."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.rows = [torch.randint(1, VOCAB, (int(torch.randint(5, 29, (1,), generator=g)),), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    """Right-padded to the longest row of the batch, with a 0/1 attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    return {"input_ids": ids, "attention_mask": mask}


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        layer = torch.nn.TransformerEncoderLayer(D, 4, 4 * D, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D, VOCAB)

    def forward(self, ids, mask):
        return self.head(self.encoder(self.embed(ids), src_key_padding_mask=mask == 0))


def main(steps: int) -> dict:
    torch.manual_seed(0)
    model = LM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Rows(steps * BATCH), batch_size=BATCH, collate_fn=collate)
    tokens, flops = 0, 0.0
    for i, batch in enumerate(loader):
        ids, mask = batch["input_ids"], batch["attention_mask"]
        tokens += int(mask.sum())
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            logits = model(ids, mask)
            loss = torch.nn.functional.cross_entropy(logits[mask == 1], ids[mask == 1])
            loss.backward()
        flops += counter.get_total_flops() * float(mask.sum()) / mask.numel()
        if i % ACCUMULATE == ACCUMULATE - 1:
            opt.step()
            opt.zero_grad()
    return {"tokens": tokens, "flops": flops, "steps": steps}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))), flush=True)
