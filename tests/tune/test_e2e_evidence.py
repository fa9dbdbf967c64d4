"""End to end, without Prometheus: `otel-gpu tune` runs the example ZeRO-3 workload, each trial records
itself with its own node agent, and every scored trial carries the node's readings and its collective
time per step over its steady window; the report explains the winner against the baseline.

On CPU (gloo, 2 ranks): host evidence and host-timed collective time per kind are there, and every GPU
column says why it is not (no GPU). With a CUDA GPU (`gpu` marker; nccl, 1 rank): the GPU columns
carry numbers.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest

from .helpers import CLI, EXAMPLE, REPO, Z3, clean_env
from .test_e2e_deepspeed import _warm_deepspeed_ops

GPU_KEYS = ("sm_activity", "tensor_activity", "gpu_utilization", "gpu_memory_peak_bytes")


def _tune(tmp_path, device: str, ranks: int, trials: int, steps: int, hidden: int, precision: str, micro: int,
          **env) -> tuple[list[dict], str]:
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not on PATH (comes with torch)")
    base = tmp_path / "ds_z3_config.json"
    shutil.copyfile(Z3, base)
    out = tmp_path / "out"
    command = (f"{torchrun} --standalone --nproc_per_node {ranks} {EXAMPLE} --deepspeed {{config}} --steps {steps} "
               f"--hidden {hidden} --device {device}")
    argv = CLI + ["tune", "--base-config", str(base), "--command", command, "--trials", str(trials), "--out", str(out),
                  "--study-name", "z3", "--hidden-size", str(hidden), "--micro-batch", str(micro), "--grad-accum", "1",
                  "--world-size", str(ranks), "--precision", precision, "--max-grad-norm", "1.0",
                  "--warmup-steps", "3", "--min-steps", "5", "--export-interval", "250", "--no-prune",
                  "--trial-timeout", "300", "--seed", "0"]
    done = subprocess.run(argv, cwd=REPO, env=clean_env(OMP_NUM_THREADS="1", OTELGPU_INTERVAL="0.25", **env),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "trials.json").read_text()), (out / "report.md").read_text()


def doc_example(steps: int, trials: int) -> tuple[dict[str, str], list[str]]:
    """docs/tune.md's "Example on one machine, no GPU", as written there (variables, then the arguments after
    `otel-gpu`), shortened to `steps` steps a trial and `trials` trials."""
    text = (REPO / "docs" / "tune.md").read_text()
    section = text[text.index("## Example on one machine, no GPU"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    words = shlex.split(next(line for line in block.splitlines() if "otel-gpu tune" in line))
    at = words.index("otel-gpu")
    env = dict(w.split("=", 1) for w in words[:at])
    args = words[at + 1:]
    i = args.index("--command")
    assert " --steps 40" in args[i + 1] and args[args.index("--trials") + 1] == "20", args
    args[i + 1] = args[i + 1].replace(" --steps 40", f" --steps {steps}")
    args[args.index("--trials") + 1] = str(trials)
    return env, args


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cpu_trials_carry_host_evidence_and_collective_time(tmp_path):
    """The docs' one-machine example as written (its base config's gradient_clipping "auto" included),
    shortened to 2 trials of 25 steps."""
    pytest.importorskip("deepspeed", reason="deepspeed not installed (pip install deepspeed after torch==2.13.0)")
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun not on PATH (comes with torch)")
    _warm_deepspeed_ops()
    env, args = doc_example(steps=25, trials=2)
    out = tmp_path / "out"
    argv = CLI + args + ["--out", str(out), "--study-name", "z3", "--warmup-steps", "3", "--min-steps", "5",
                         "--export-interval", "250", "--no-prune", "--seed", "0"]
    done = subprocess.run(argv, cwd=REPO, env=clean_env(OMP_NUM_THREADS="1", OTELGPU_INTERVAL="0.25", **env),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'gradient_clipping "auto": assumed 1.0' in done.stdout, done.stdout[-3000:]
    rows, text = json.loads((out / "trials.json").read_text()), (out / "report.md").read_text()
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 2, rows
    for r in ok:
        ev = r["evidence"]
        assert ev["cpu_busy"] is not None and 0 < ev["cpu_busy"] <= 1, ev
        kinds = ev["collectives"] or {}
        assert {"all_gather", "reduce_scatter"} <= set(kinds) and all(v > 0 for v in kinds.values()), ev
        assert ev["collective_basis"] == "host", ev   # gloo: the rank's thread blocked in the call
        for key in GPU_KEYS:
            assert ev[key] is None and ev["not_checked"][key].startswith("not checked: no GPU"), ev
    assert "## The winner against the baseline" in text or "(baseline values)" in text
    assert "step time vs baseline" in text and "noise not measured: only 1 baseline run" in text


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_cuda_trials_carry_gpu_evidence(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed")
    pytest.importorskip("deepspeed", reason="deepspeed not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (this torch build or machine has none)")
    rows, text = _tune(tmp_path, "cuda", ranks=1, trials=4, steps=60, hidden=1024, precision="bf16", micro=8)
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= 3, rows
    for r in ok:
        ev = r["evidence"]
        assert 0 < ev["gpu_utilization"] <= 1 and ev["gpu_memory_peak_bytes"] > 2**20, ev
        assert ev["sm_activity"] is not None or "GPM" in ev["not_checked"]["sm_activity"], ev
        assert ev["cpu_busy"] is not None, ev
    assert "## The winner against the baseline" in text and "step time vs baseline" in text
