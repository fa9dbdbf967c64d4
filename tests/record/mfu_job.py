"""A plain loop with no otel-gpu code over a small transformer-shaped model (a config with layers and
hidden size, token-id batches from a DataLoader), under CPU autocast to bfloat16: what the MFU pipeline
test runs on a fake GPU. argv: steps."""
import sys
import time
from types import SimpleNamespace

import torch

SEQ, BATCH, HIDDEN, VOCAB = 32, 8, 64, 256


class Ids(torch.utils.data.Dataset):
    def __init__(self, n):
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        time.sleep(0.004)   # a little data wait
        return self.ids[i]


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=2, hidden_size=HIDDEN)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(2))
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def main(steps: int):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for ids in torch.utils.data.DataLoader(Ids(steps * BATCH), batch_size=BATCH):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), ids.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)   # host work between the phases
    print("finished", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
