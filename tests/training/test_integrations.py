"""HF Trainer, Lightning and DeepSpeed ZeRO-3, each trained for real on CPU, read back with PromQL.

Each framework runs twice at once: instrumented explicitly (the documented API) and
untouched under `otel-gpu run` (zero code change); both must report the same steps.
"""
import shutil
import subprocess
import sys

import pytest

from conftest import HERE, REPO, otlp_env, query_until, unique_job
from pyroscope_receiver import Receiver

pytestmark = pytest.mark.slow
RUN = [sys.executable, "-c", "import sys; from otel_gpu.cli import main; sys.exit(main())", "run"]


def _start(args, env):
    return subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=180):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


def _by(series, label):
    return {s.labels.get(label): s.value for s in series}


def _explicit_and_zero_code(vm, script, tmp_path, prefix):
    explicit, zero = unique_job(prefix + "-explicit"), unique_job(prefix + "-run")
    a = _start([sys.executable, str(HERE / script), str(tmp_path / "a"), "--explicit"], otlp_env(vm, explicit))
    b = _start(RUN + ["--job", zero, "--no-profile", "--", sys.executable, str(HERE / script), str(tmp_path / "b")],
               otlp_env(vm, "ignored-by-run"))
    assert "finished" in _finish(a) and "finished" in _finish(b)
    return explicit, zero


def test_hf_trainer(victoriametrics, tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (otel-gpu[train])")
    vm = victoriametrics
    for job in _explicit_and_zero_code(vm, "hf_train.py", tmp_path, "hf"):
        sel = f'otelgpu_job="{job}"'
        assert query_until(vm, f"otelgpu_train_steps_total{{{sel}}}", 1)[0].value == 8       # max_steps
        assert query_until(vm, f"otelgpu_train_samples_total{{{sel}}}", 1)[0].value == 8 * 4  # batch 4
        assert query_until(vm, f"otelgpu_train_tokens_total{{{sel}}}", 1)[0].value == 8 * 4 * 13  # padding left out
        phases = _by(query_until(vm, f"otelgpu_train_phase_time_seconds_total{{{sel}}}", 6), "otelgpu_phase")
        assert set(phases) == {"data_wait", "forward", "backward", "optimizer", "checkpoint", "eval"}
        ckpt = _by(query_until(vm, f"otelgpu_train_checkpoints_total{{{sel}}}", 2), "otelgpu_checkpoint_event")
        assert ckpt == {"start": 2, "end": 2}                                              # save_steps=4


def test_lightning(victoriametrics, tmp_path):
    pytest.importorskip("lightning", reason="lightning not installed (otel-gpu[train])")
    vm = victoriametrics
    for job in _explicit_and_zero_code(vm, "lightning_train.py", tmp_path, "lightning"):
        sel = f'otelgpu_job="{job}"'
        assert query_until(vm, f"otelgpu_train_steps_total{{{sel}}}", 1)[0].value == 12
        assert query_until(vm, f"otelgpu_train_samples_total{{{sel}}}", 1)[0].value == 12 * 8
        assert query_until(vm, f"otelgpu_train_tokens_total{{{sel}}}", 1, timeout=0) == []      # float batches: no tokens
        phases = _by(query_until(vm, f"otelgpu_train_phase_time_seconds_total{{{sel}}}", 5), "otelgpu_phase")
        assert set(phases) == {"data_wait", "forward", "backward", "optimizer", "checkpoint", "eval"}
        ckpt = _by(query_until(vm, f"otelgpu_train_checkpoints_total{{{sel}}}", 2), "otelgpu_checkpoint_event")
        assert ckpt["start"] == ckpt["end"] >= 1


def test_deepspeed_zero3_two_ranks_under_otel_gpu_run(victoriametrics, tmp_path):
    """The seed case: ZeRO-3, 2 ranks (gloo), flame graph waits in fetch_sub_module / ipg reduce."""
    pytest.importorskip("deepspeed", reason="deepspeed not installed (otel-gpu[train])")
    vm, job, steps = victoriametrics, unique_job("zero3"), 40   # with 8 layers: ~10+ samples of fetches per rank at 50 Hz
    from servers import free_port

    with Receiver() as rx:
        cmd = RUN + ["--job", job, "--pyroscope", rx.url, "--", shutil.which("torchrun") or "torchrun",
                     "--nproc_per_node", "2", "--master_port", str(free_port()),
                     str(HERE / "ds_train.py"), str(steps), str(tmp_path / "ckpt")]
        # pushes every 2 s: a rank's samples never hinge on its single push at exit
        out = _finish(_start(cmd, otlp_env(vm, "ignored", DS_ACCELERATOR="cpu", OTELGPU_PROFILE_UPLOAD_S="2")),
                      timeout=240)
    assert "rank 0 finished" in out and "rank 1 finished" in out

    sel = f'otelgpu_job="{job}"'
    assert _by(query_until(vm, f"otelgpu_train_steps_total{{{sel}}}", 2), "otelgpu_rank") == {"0": steps, "1": steps}
    samples = query_until(vm, f"otelgpu_train_samples_total{{{sel}}}", 2)
    assert [s.value for s in samples] == [steps * 4 * 2] * 2                      # micro batch 4 x accumulation 2
    phases = query_until(vm, f'otelgpu_train_phase_time_seconds_total{{{sel},otelgpu_rank="1"}}', 4)
    assert set(_by(phases, "otelgpu_phase")) == {"forward", "backward", "optimizer", "checkpoint"}
    # the torchrun launcher process (no RANK, so it would say world size 1) never trains: it exports nothing
    assert query_until(vm, f'{{__name__=~"otelgpu_train.*",{sel},otelgpu_world_size!="2"}}', 1, timeout=0) == []

    # one profile series per rank, phases on the samples, ZeRO-3's communication waits in the stacks
    assert sorted({p.series["rank"] for p in rx.profiles}) == ["0", "1"]   # one push per 2 s and one at exit
    assert {p.series["job"] for p in rx.profiles} == {job}
    for rank in ("0", "1"):
        fwd = rx.weight(lambda s, r=rank: s.labels.get("phase") == "forward" and _rank_of(rx, s) == r)
        bwd = rx.weight(lambda s, r=rank: s.labels.get("phase") == "backward" and _rank_of(rx, s) == r)
        assert fwd.get("PartitionedParameterCoordinator.fetch_sub_module", 0) > 0
        assert bwd.get("DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads", 0) > 0
    ckpt = rx.weight(lambda s: s.labels.get("phase") == "checkpoint")
    assert ckpt.get("DeepSpeedEngine.save_checkpoint", 0) > 0


def _rank_of(rx, sample):
    for p in rx.profiles:
        if any(s is sample for s in p.samples):
            return p.series.get("rank")
    return None
