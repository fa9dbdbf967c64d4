"""A tiny Lightning module trained on CPU. `--explicit`: pass the callback; else rely on `otel-gpu run`."""
import sys

import lightning.pytorch as L
import torch


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(n):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 4, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=8)


def main(out_dir: str, explicit: bool):
    callbacks = []
    if explicit:
        from otel_gpu.training.lightning import OtelGpuCallback
        callbacks.append(OtelGpuCallback())
    trainer = L.Trainer(max_steps=12, limit_val_batches=2, val_check_interval=6, accelerator="cpu", devices=1,
                        default_root_dir=out_dir, callbacks=callbacks, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Tiny(), loader(96), loader(16))
    print("finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], "--explicit" in sys.argv)
