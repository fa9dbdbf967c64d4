"""Benchmark `otel-gpu tune` on the CPU ZeRO-3 workload (examples/tune/train_zero3.py, 2 ranks, gloo),
and (--sampling) the sample efficiency of its search on a replayed objective.

    python bench/bench_tune.py [--trials 20] [--steps 40] [--repeats 3] [--json OUT]
    python bench/bench_tune.py --sampling [--seeds 50] [--json OUT]

--sampling: the tuner's pick after 15 trials against the best of a 40-trial random search, over
`--seeds` seeds, on the synthetic ZeRO-3 surface of bench/tune_replay.py (seconds, no training).

1. Study with pruning: `--trials` trials from LLaMA-Factory's ds_z3_config.json ("auto" resolved
   for the example's hidden size 64), scored from PromQL against a VictoriaMetrics started here.
2. The same study (same seed, same command) without pruning.
3. Confirmation: the baseline config and the best config of study 1, run `--repeats` times each,
   interleaved, scored the same way; the ratio of their median step times is the speed-up.
Reported: baseline and best step time and their ratio; the tuner's own time per trial (config
generation, validation, launch, scoring: `overhead_s`) against the trial's wall time; the share
of total tuning time pruning saved (1 - time with pruning / time without; and, immune to load
changes between the two studies, the time the pruned trials' unrun steps would have taken at
their own step time over the pruned study's total).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from otel_gpu.promql import PromClient  # noqa: E402
from otel_gpu.tune import config as C  # noqa: E402
from otel_gpu.tune import trial as T  # noqa: E402
from otel_gpu.tune.objective import PromObjective  # noqa: E402
from otel_gpu.tune.space import Space  # noqa: E402
from otel_gpu.tune.study import Settings, Tuner, storage_url  # noqa: E402

BASE = ROOT / "tests" / "data" / "deepspeed" / "llamafactory_ds_z3_config.json"
EXAMPLE = ROOT / "examples" / "tune" / "train_zero3.py"
FACTS = C.Facts(hidden_size=64, micro_batch=4, grad_accum=1, world_size=2, max_grad_norm=1.0, precision="fp32")


def flusher(vm, stop: threading.Event) -> None:
    while not stop.wait(0.3):
        try:
            vm.flush()
        except Exception:   # server going away at the end
            return


def env_for() -> dict[str, str]:
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OTEL_", "OTELGPU_", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return env


def study(vm, work: Path, name: str, trials: int, steps: int, prune: bool, seed: int) -> dict:
    command = f"{shutil.which('torchrun')} --standalone --nproc_per_node 2 {EXAMPLE} --deepspeed {{config}} --steps {steps}"
    s = Settings(base_config=BASE, command=command, trials=trials, out=work / name,
                 storage=storage_url(work / name / "study.db"), study_name=name, space=Space(), facts=FACTS,
                 timeout_s=600, warmup=3, min_steps=5, prune=prune, prune_ratio=1.25, prune_min_steps=3,
                 poll_s=1.0, otlp_endpoint=vm.url + "/opentelemetry", export_interval_ms=250, seed=seed)
    t0 = time.monotonic()
    tuner = Tuner(s, PromObjective(PromClient(vm.url), warmup=3, settle_s=15), env=env_for(),
                  events=lambda kind, r: kind == "end" and print(
                      f"  [{name}] trial {r.number} {r.status} {r.step_time_s} s/step, wall {r.seconds:.1f} s, "
                      f"overhead {r.overhead_s:.2f} s", flush=True))
    tuner.prepare()
    startup = time.monotonic() - t0
    records = tuner.run()
    total = time.monotonic() - t0
    launched = [r for r in records if r.seconds > 0]
    shares = [r.overhead_s / (r.seconds + r.overhead_s) for r in launched]
    # load-independent estimate: what each pruned trial would have cost had it run its remaining
    # steps at its own measured step time
    skipped = sum(max(0, steps - r.total_steps) * r.step_time_s for r in records
                  if r.status == "pruned" and r.step_time_s)
    base = next(r for r in records if r.role == "baseline")
    best = min((r for r in records if r.status == "ok"), key=lambda r: r.step_time_s)
    return {"total_s": total, "startup_s": startup, "trials": len(records),
            "statuses": {k: sum(r.status == k for r in records) for k in {r.status for r in records}},
            "trial_wall_s_mean": statistics.mean(r.seconds for r in launched),
            "overhead_s_mean": statistics.mean(r.overhead_s for r in launched),
            "overhead_s_max": max(r.overhead_s for r in launched),
            "overhead_share_mean": statistics.mean(shares), "overhead_share_max": max(shares),
            "pruned_steps_time_skipped_s": skipped,
            "pruning_saved_share_estimate": skipped / (total + skipped),
            "baseline_step_s": base.step_time_s, "best_step_s": best.step_time_s, "best_trial": best.number,
            "best_params": best.params, "best_config": str(Path(best.directory) / "ds_config.json")}


def confirm(vm, work: Path, configs: dict[str, Path], repeats: int, steps: int) -> dict:
    """Run each config `repeats` times, interleaved; median steady step time of each."""
    obj = PromObjective(PromClient(vm.url), warmup=3, settle_s=15)
    times: dict[str, list[float]] = {k: [] for k in configs}
    for i in range(repeats):
        for label, cfg in configs.items():
            trial_id = f"confirm-{label}-{i}-{time.time_ns()}"
            d = work / "confirm" / f"{label}-{i}"
            command = f"{shutil.which('torchrun')} --standalone --nproc_per_node 2 {EXAMPLE} --deepspeed {cfg} --steps {steps}"
            env = T.trial_env(env_for(), trial_id, otlp_endpoint=vm.url + "/opentelemetry", export_interval_ms=250)
            run = T.run_trial(T.TrialPlan(i, trial_id, d, command, env, 600))
            stats = obj.final(trial_id, d, run.started, run.ended, 5)
            print(f"  [confirm] {label} #{i}: {run.status} {stats.step_time_s} s/step", flush=True)
            if run.status == T.OK and stats.step_time_s:
                times[label].append(stats.step_time_s)
    return {k: {"runs": v, "median": statistics.median(v) if v else None} for k, v in times.items()}


def main() -> int:
    from servers import VictoriaMetrics

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per trial")
    p.add_argument("--repeats", type=int, default=3, help="confirmation runs per config")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--sampling", action="store_true", help="only the replayed sample-efficiency comparison")
    p.add_argument("--seeds", type=int, default=50, help="--sampling: seeds per method")
    args = p.parse_args()
    if args.sampling:
        return sampling(args)
    work = Path(tempfile.mkdtemp(prefix="bench-tune-"))
    stop = threading.Event()
    (work / "vm").mkdir()
    with VictoriaMetrics(work / "vm") as vm:
        threading.Thread(target=flusher, args=(vm, stop), daemon=True).start()
        pruned = study(vm, work, "pruning", args.trials, args.steps, True, args.seed)
        full = study(vm, work, "no-pruning", args.trials, args.steps, False, args.seed)
        baseline_cfg = work / "pruning" / "trials" / "0000" / "ds_config.json"
        check = confirm(vm, work, {"baseline": baseline_cfg, "best": Path(pruned["best_config"])},
                        args.repeats, args.steps)
        stop.set()
    result = {
        "workload": f"examples/tune/train_zero3.py, 2 ranks CPU gloo, hidden 64, {args.steps} steps/trial",
        "cores": os.cpu_count(), "with_pruning": pruned, "without_pruning": full, "confirmation": check,
        "speedup_best_vs_baseline": (check["baseline"]["median"] / check["best"]["median"]
                                     if check["baseline"]["median"] and check["best"]["median"] else None),
        "pruning_time_saved_share": 1 - pruned["total_s"] / full["total_s"],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


def sampling(args) -> int:
    """The tuner's sampler (15 trials) against random search (40), and the alternatives measured."""
    import optuna
    import tune_replay as R

    def tpe(multivariate: bool, startup: int):
        return lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=multivariate, constant_liar=True,
                                                       n_startup_trials=startup)

    space, _ = R.study_space()
    t0 = time.monotonic()
    result = {"surface_optimum_ms": R.optimum_ms(space), "methods": {}}
    variants = {"tuner (as shipped: queue + independent TPE, 5 start-up)": {},
                "queue + multivariate TPE, 8 start-up (before)": {"make": tpe(True, 8)},
                "independent TPE alone, no queue": {"with_queue": False}}
    for name, kw in variants.items():
        r = R.compare(seeds=args.seeds, **kw)
        result["methods"][name] = r
        print(f"{name}: best after 15 median {r['tuner_ms']['median']:.1f} ms (mean {r['tuner_ms']['mean']:.1f}, "
              f"p90 {r['tuner_ms']['p90']:.1f}) | random search 40: median {r['random_long_ms']['median']:.1f} "
              f"(mean {r['random_long_ms']['mean']:.1f}, p90 {r['random_long_ms']['p90']:.1f}) | "
              f"random 15: median {r['random_short_ms']['median']:.1f} | at least as good as random-40 in "
              f"{r['tuner_at_least_as_good_share'] * 100:.0f}% of seeds | ratio of medians "
              f"{r['median_ratio_random_long_over_tuner']:.3f}", flush=True)
    result["baseline_ms"] = next(iter(result["methods"].values()))["baseline_ms"]
    result["seconds"] = time.monotonic() - t0
    print(f"baseline {result['baseline_ms']:.1f} ms, surface optimum {result['surface_optimum_ms']:.1f} ms, "
          f"{args.seeds} seeds, {result['seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
