"""A GPT-2-small-sized language model (124M parameters, random weights, random tokens) trained on one
GPU for a fixed time, with no otel-gpu code: the GPU check's job under `otel-gpu run`.

    otel-gpu run -- python examples/gpt2_train.py [--seconds 40] [--batch 16] [--seq 512]

bf16 autocast, AdamW; batches come from a DataLoader with 2 workers that build each sequence in Python
(a few ms a batch), so the input side shows in the report too. Nothing is downloaded (the model is
built from transformers' GPT2Config). `--layers`/`--hidden` make it smaller; `--device cpu` runs it
without a GPU (slowly: for trying the pipeline, with a small model).
"""
import argparse
import sys
import time

import torch


class RandomTokens(torch.utils.data.IterableDataset):
    """Endless batches of random token ids (int64, batch x seq), built element by element."""

    def __init__(self, vocab: int, batch: int, seq: int):
        self.vocab, self.batch, self.seq = vocab, batch, seq

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        gen = torch.Generator().manual_seed(worker.id if worker else 0)
        while True:
            yield torch.randint(self.vocab, (self.batch, self.seq), generator=gen)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=40.0, help="training time after the first step, seconds")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    args = p.parse_args()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("gpt2_train: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=max(1, args.hidden // 64),
                        n_positions=max(1024, args.seq))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loader = torch.utils.data.DataLoader(RandomTokens(config.vocab_size, args.batch, args.seq), batch_size=None,
                                         num_workers=2, pin_memory=device == "cuda")
    print(f"gpt2_train: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters on {device}", flush=True)
    start, steps = None, 0
    for ids in loader:
        ids = ids.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if start is None:
            loss.item()
            start = time.monotonic()
        elif time.monotonic() - start >= args.seconds:
            break
    took = time.monotonic() - start
    print(f"gpt2_train: {steps} steps, {(steps - 1) / took:.2f} steps/s after the first, loss {loss.item():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
