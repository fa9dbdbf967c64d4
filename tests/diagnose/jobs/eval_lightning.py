"""A Lightning module trained with DDP on CPU (2 ranks, gloo) that validates mid-epoch, as a user writes
it (no otel-gpu import).

    torchrun --nproc_per_node 2 eval_lightning.py TRUTH.json OUT_DIR --steps 70 --val-every 30 --val-batches 10

The epoch is longer than --steps, so every validation pass runs mid-epoch, after each --val-every training
batches (`val_check_interval`), on --val-batches batches (`limit_val_batches`), the loss logged with
`sync_dist=True` (an all-reduce per batch). Lightning's sanity check runs --sanity batches of validation
before the first training batch. Each rank writes what it measured with its own callback: the seconds
from the first training batch's start to the end of training, the seconds in validation passes during
training (`on_validation_start` .. `on_validation_end`), their ratio, the sanity check's seconds (before
the first batch, so outside that wall time), the steps, the passes and the training batches' own mean time.
"""
import argparse
import json
import time

import lightning.pytorch as L
import torch

p = argparse.ArgumentParser()
p.add_argument("truth")
p.add_argument("out_dir")
p.add_argument("--steps", type=int, default=70)
p.add_argument("--val-every", type=int, default=30)
p.add_argument("--val-batches", type=int, default=10)
p.add_argument("--sanity", type=int, default=2)
p.add_argument("--hidden", type=int, default=768)
a = p.parse_args()


class Net(L.LightningModule):
    def __init__(self, h: int):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, h), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 16))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("val_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clock(L.Callback):
    """The user's own stopwatch: training batches, validation passes (sanity check apart), wall time."""

    def __init__(self):
        self.first = self.began = self.val_began = self.end = None
        self.steps, self.step_s = 0, 0.0
        self.passes, self.val_s, self.sanity_s = 0, 0.0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.began = time.perf_counter()
        if self.first is None:
            self.first = self.began

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps += 1
        self.step_s += time.perf_counter() - self.began

    def on_validation_start(self, trainer, pl_module):
        self.val_began = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        took = time.perf_counter() - self.val_began
        if trainer.sanity_checking:
            self.sanity_s += took
        else:
            self.val_s += took
            self.passes += 1

    def on_train_end(self, trainer, pl_module):
        self.end = time.perf_counter()


def data(n: int, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ds = torch.utils.data.TensorDataset(torch.randn(n * batch, 256, generator=g),
                                        torch.randn(n * batch, 16, generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=batch)


torch.set_num_threads(1)
torch.manual_seed(0)
clock = Clock()
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=a.steps, val_check_interval=a.val_every,
                    limit_val_batches=a.val_batches, num_sanity_val_steps=a.sanity, default_root_dir=a.out_dir,
                    callbacks=[clock], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
# each rank's share of an epoch (DistributedSampler halves it) is longer than --steps: validation runs mid-epoch
trainer.fit(Net(a.hidden), data(4 * a.steps, 32, 0), data(2 * a.val_batches, 256, 1))
wall = clock.end - clock.first
rank = trainer.global_rank
with open(a.truth.format(rank=rank), "w") as fh:
    json.dump({"rank": str(rank), "steps": clock.steps, "passes": clock.passes, "wall_s": wall,
               "eval_s": clock.val_s, "eval_share": clock.val_s / wall, "sanity_s": clock.sanity_s,
               "train_step_s": clock.step_s / clock.steps, "global_step": trainer.global_step}, fh)
print("finished", flush=True)
