"""A fast stand-in for a training job: step time is a known function of the DeepSpeed config.

    python fake_train.py --deepspeed CONFIG [--steps N] [--crash-when K=V] [--oom-when K=V] [--hang-when K=V]
                         [--build-op SOURCE.cpp] [--trial N --hold-trials 1,3 [--hold-s 60]]

Steps are timed with the plain-loop API (`otel_gpu.training.step`), so with OTLP configured
their metrics reach the backend exactly as a real job's do; rank 0's tqdm-style progress line
goes to stdout. No torch: each step sleeps `step_time(config)` seconds. With --build-op, torch JIT-builds the
C++ file as an extension first (its own lock and build folder, the way DeepSpeed builds its ops).
With --hold-trials, the trials numbered there (--trial {trial}) keep stepping until they are stopped
(at most --hold-s seconds, then exit 3): a trial that is certainly still running when a test stops its tuner.
"""
import argparse
import json
import math
import sys
import time


def step_time(config: dict) -> float:
    """20 ms, plus 15 ms without overlap_comm, plus up to ~25 ms for small reduce buckets."""
    z = config["zero_optimization"]
    t = 0.020 + (0.0 if z.get("overlap_comm") else 0.015)
    t += 0.005 * max(0.0, 9 - math.log10(max(1, z.get("reduce_bucket_size", 5e8))))
    return t


def matches(config: dict, spec: str | None) -> bool:
    if not spec:
        return False
    key, _, value = spec.partition("=")
    return str(config["zero_optimization"].get(key)) == value


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--deepspeed", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup-extra", type=float, default=0.1, help="extra seconds of the first step")
    p.add_argument("--crash-when"), p.add_argument("--oom-when"), p.add_argument("--hang-when")
    p.add_argument("--no-tokens-when", help="K=V: a config that counts no tokens (--tokens ignored)")
    p.add_argument("--build-op", help="a C++ file torch builds as extension otelgpu_test_op before step 1")
    p.add_argument("--trial", type=int, help="this trial's number ({trial})")
    p.add_argument("--hold-trials", default="", help="comma-separated trial numbers that run until stopped")
    p.add_argument("--hold-s", type=float, default=60.0, help="the most a held trial runs (seconds)")
    p.add_argument("--tokens", type=int, default=0, help="tokens of a 20 ms step; a step of t ms has N x (t/20)^2 "
                   "(slower configs do more work per second: step time and tokens/s disagree)")
    args = p.parse_args()
    hold = args.trial is not None and str(args.trial) in args.hold_trials.split(",")
    with open(args.deepspeed) as f:
        config = json.load(f)
    if args.build_op:
        from torch.utils.cpp_extension import load

        print(load(name="otelgpu_test_op", sources=[args.build_op], is_python_module=False), flush=True)
    from otel_gpu import training

    dt = step_time(config)
    t0 = time.monotonic()
    i = 0
    while i < args.steps or hold:
        if hold and time.monotonic() - t0 > args.hold_s:
            print(f"\nheld trial {args.trial} was never stopped", file=sys.stderr, flush=True)
            return 3
        if i == 2 and matches(config, args.oom_when):
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
            return 1
        if i == 2 and matches(config, args.crash_when):
            raise RuntimeError("simulated crash in the training loop")
        if i == 3 and matches(config, args.hang_when):
            while True:
                time.sleep(1)
        counted = args.tokens and not matches(config, args.no_tokens_when)
        tokens = round(args.tokens * (dt / 0.020) ** 2) if counted else None
        with training.step(samples=1, tokens=tokens):
            time.sleep(dt + (args.warmup_extra if i == 0 else 0.0))
        elapsed = time.monotonic() - t0
        m, s = divmod(int(elapsed), 60)
        print(f"\r{i + 1}/{args.steps} [{m:02d}:{s:02d}<00:00, {dt:.2f}s/it]", end="", flush=True)
        i += 1
    print(f"\nfinished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
