"""The hot-path cost of what a hang is judged on, A/B against another checkout in one process.

Loads `otel_gpu/training/timing.py` of this tree and of BASE (a checkout before the change, e.g. from
`git archive REV | tar -x -C /tmp/base`) side by side and times, in interleaved rounds (median):
- a host-timed collective's bookkeeping: `Timer.wait_begin(kind)` + `wait_end` inside a step and a
  phase (this tree also keeps the outermost wait's kind and start for `otelgpu.train.collective.open`);
- a step's end in the sink without and with the `time.time()` that `otelgpu.train.step.last` keeps.

    python bench/bench_wait_state.py BASE [--rounds 15] [--calls 20000]
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Sink:
    """A step end as OtelSink's hot path makes it, with or without the latest-step time."""

    def __init__(self, stamp: bool):
        self.stamp, self.steps, self.last = stamp, 0, None

    def step(self, seconds, samples, tokens):
        self.steps += 1
        if self.stamp:
            self.last = time.time()

    def phase(self, name, seconds): pass

    def checkpoint(self, event): pass

    def collective(self, kind, phase, seconds): pass


def wait_pair(timing, calls: int) -> float:
    """Seconds per wait_begin + wait_end inside a step and a phase."""
    t = timing.Timer(Sink(False))
    t.begin_step("user")
    t.enter("backward")
    begin, end = t.wait_begin, t.wait_end
    with_kind = "kind" in inspect.signature(begin).parameters
    t0 = time.perf_counter()
    if with_kind:
        for _ in range(calls):
            end("all_reduce", begin("all_reduce"))
    else:
        for _ in range(calls):
            end("all_reduce", begin())
    return (time.perf_counter() - t0) / calls


def step_end(stamp: bool, calls: int) -> float:
    s = Sink(stamp)
    t0 = time.perf_counter()
    for _ in range(calls):
        s.step(0.1, None, None)
    return (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path, help="the other checkout's root")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    base_py = a.base / "otel_gpu" / "training" / "timing.py"
    if not base_py.is_file():
        sys.exit(f"bench_wait_state: {base_py} not found: BASE must be a checkout's root")
    base, ours = load(base_py, "timing_base"), load(HERE / "otel_gpu" / "training" / "timing.py", "timing_ours")
    b, o, plain, stamped = [], [], [], []
    for _ in range(a.rounds):
        b.append(wait_pair(base, a.calls))
        o.append(wait_pair(ours, a.calls))
        plain.append(step_end(False, a.calls))
        stamped.append(step_end(True, a.calls))
    med = statistics.median
    diffs = [y - x for x, y in zip(b, o)]
    print(f"wait_begin + wait_end: base {med(b) * 1e9:.0f} ns, this tree {med(o) * 1e9:.0f} ns, added "
          f"{(med(o) - med(b)) * 1e9:+.0f} ns (per-round differences {min(diffs) * 1e9:+.0f} to {max(diffs) * 1e9:+.0f} ns; "
          f"{a.rounds} rounds x {a.calls} calls)")
    print(f"step end: {med(plain) * 1e9:.0f} ns, with the latest-step time {med(stamped) * 1e9:.0f} ns, added "
          f"{(med(stamped) - med(plain)) * 1e9:+.0f} ns")


if __name__ == "__main__":
    main()
