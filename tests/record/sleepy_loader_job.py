"""A loop fed by a DataLoader whose two workers only sleep (a loader waiting on storage or a service,
not on CPU): input-bound while the job uses little CPU. No otel-gpu code.

    python sleepy_loader_job.py STEPS
"""
import sys
import time

import torch


class Sleepy(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.02)            # 80 ms per batch of 4 per worker: ~40 ms a batch with two workers
        return torch.zeros(16), torch.zeros(1)


def main() -> int:
    steps = int(sys.argv[1])
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Sleepy(4 * steps), batch_size=4, num_workers=2)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return 0


if __name__ == "__main__":
    sys.exit(main())
