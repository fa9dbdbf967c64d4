"""A trial killed while torch JIT-builds an extension must not poison the trials after it.

Real builds: the fake job builds a tiny C++ file with torch.utils.cpp_extension.load (its lock
and build folder, as DeepSpeed's op builds use them); a compiler wrapper stalls the first build
so the trial timeout kills it mid-build.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from otel_gpu.tune import extensions as X
from otel_gpu.tune import trial as T
from otel_gpu.tune.objective import LogObjective
from otel_gpu.tune.space import parse_space
from otel_gpu.tune.study import Tuner

from .helpers import clean_env, copy_base, fake_command
from .test_study import _settings

pytest.importorskip("torch.utils.cpp_extension", reason="torch (the `train` extra) builds the test extension")
ONE_KNOB = parse_space({"params": {k: False for k in ("contiguous_gradients", "sub_group_size", "reduce_bucket_size",
                                                      "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                                                      "stage3_max_live_parameters", "stage3_max_reuse_distance")}})


def _lock_like_torch(folder, hold: bool):
    """Take torch's build lock (FileBaton: O_CREAT | O_EXCL) in a child process that then either
    exits without releasing it (a killed build) or keeps holding it (a live build)."""
    folder.mkdir(parents=True)
    code = ("import os, sys, time; from torch.utils.file_baton import FileBaton; "
            f"b = FileBaton({str(folder / 'lock')!r}); assert b.try_acquire(); print('locked', flush=True); "
            + ("time.sleep(600)" if hold else "os._exit(0)"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_lock_no_process_holds_is_removed_with_its_build_folder(tmp_path):
    root = tmp_path / "ext"
    dead = _lock_like_torch(root / "py311_cpu" / "killed_op", hold=False)
    dead.wait()
    (root / "py311_cpu" / "killed_op" / "half.o").write_bytes(b"\0" * 10)
    live = _lock_like_torch(root / "py311_cpu" / "building_op", hold=True)
    try:
        locks = {lock.path.parent.name: lock for lock in X.find_locks([root])}
        assert locks["killed_op"].stale and not locks["building_op"].stale
        assert locks["building_op"].holders == (live.pid,)
        assert X.clean_stale([root]) == [root / "py311_cpu" / "killed_op"]
        assert not (root / "py311_cpu" / "killed_op").exists()
        assert (root / "py311_cpu" / "building_op" / "lock").exists()      # a live build is left alone
        assert sorted(p.name for p in (root / "py311_cpu").iterdir()) == ["building_op"]
    finally:
        live.kill()
        live.wait()


def test_extension_roots_follow_torch():
    assert X.extension_roots({"TORCH_EXTENSIONS_DIR": "/x"}) == [X.Path("/x")]
    assert X.extension_roots({"XDG_CACHE_HOME": "/c"}) == [X.Path("/c/torch_extensions")]
    assert X.extension_roots({"HOME": "/h"}) == [X.Path("/h/.cache/torch_extensions")]


def _op_source(tmp_path):
    src = tmp_path / "op.cpp"
    src.write_text('extern "C" int otelgpu_test_op(void) { return 42; }\n')
    return src


@pytest.mark.slow
def test_a_trial_killed_mid_build_does_not_poison_the_next(tmp_path):
    """Trial 0's build stalls (the compiler wrapper sleeps once) and is killed at its timeout,
    leaving torch's lock; it is a start-up hang that says so, and trial 1 builds and runs."""
    ext = tmp_path / "torch_extensions"
    stall = tmp_path / "cxx"
    stall.write_text(f'#!/bin/sh\nif mkdir {tmp_path}/stalled 2>/dev/null; then sleep 600; fi\nexec c++ "$@"\n')
    stall.chmod(0o755)
    env = clean_env(TORCH_EXTENSIONS_DIR=str(ext), CXX=str(stall))
    s = _settings(tmp_path, copy_base(tmp_path), fake_command("--build-op", str(_op_source(tmp_path)), steps=6),
                  trials=2, space=ONE_KNOB, timeout_s=20.0, grace_s=1.0, prune=False, instrument=False)
    notes = []
    tuner = Tuner(s, LogObjective(warmup=1), env=env, events=lambda kind, p: notes.append(p) if kind == "note" else None)
    tuner.prepare()
    first, second = tuner.run()
    assert first.status == T.HANG, first.reason
    assert first.reason.startswith("start-up hang: no training step within the 20 s trial timeout")
    assert "still building the torch extension otelgpu_test_op" in first.reason
    assert "removed the half-built torch extension it left: otelgpu_test_op" in first.reason
    assert any("after trial 0" in n for n in notes)
    assert second.status == T.OK, second.reason
    assert X.find_locks([ext]) == []


@pytest.mark.slow
def test_a_trial_stuck_on_another_builds_lock_is_a_start_up_hang_naming_it(tmp_path):
    ext = tmp_path / "torch_extensions"
    holder = _lock_like_torch(ext / "otelgpu_test_op", hold=True)
    try:
        s = _settings(tmp_path, copy_base(tmp_path), fake_command("--build-op", str(_op_source(tmp_path)), steps=6),
                      trials=1, space=ONE_KNOB, timeout_s=8.0, grace_s=1.0, prune=False, instrument=False)
        tuner = Tuner(s, LogObjective(warmup=1), env=clean_env(TORCH_EXTENSIONS_DIR=str(ext)))
        tuner.prepare()
        (record,) = tuner.run()
        assert record.status == T.HANG
        assert f"held by pid {holder.pid}): another build on this node" in record.reason, record.reason
        assert (ext / "otelgpu_test_op" / "lock").exists()           # not ours to remove
    finally:
        holder.kill()
        holder.wait()


def test_startup_hang_reason_falls_back_to_the_last_output():
    assert T.startup_hang_reason(60, None, "loading\r50%\r\n\n") == (
        "start-up hang: no training step within the 60 s trial timeout; process group killed; last output: 50%")
    assert T.startup_hang_reason(60, None, "").endswith("no output at all")


@pytest.mark.slow
def test_prebuild_refuses_an_unknown_op_in_one_line(tmp_path):
    s = _settings(tmp_path, copy_base(tmp_path), fake_command(steps=2), trials=1, space=ONE_KNOB,
                  instrument=False, prebuild_ops=("NoSuchOpBuilder",))
    tuner = Tuner(s, LogObjective(warmup=1), env=clean_env(TORCH_EXTENSIONS_DIR=str(tmp_path / "ext")))
    with pytest.raises(X.PrebuildError) as err:
        tuner.prepare()
    assert str(err.value) == "--prebuild-ops: DeepSpeed has no op builder 'NoSuchOpBuilder' for this accelerator"


@pytest.mark.slow
def test_a_prebuild_stalled_past_the_timeout_is_killed_and_cleaned(tmp_path):
    """DeepSpeed's own op build (the CPU accelerator's shared-memory comm op), stalled by the
    compiler wrapper: killed at the timeout, named, and its half-built folder removed."""
    pytest.importorskip("deepspeed", reason="DeepSpeed (the `train` extra) provides the op builders")
    ext = tmp_path / "ext"
    stall = tmp_path / "cxx"
    stall.write_text('#!/bin/sh\nsleep 600\n')
    stall.chmod(0o755)
    s = _settings(tmp_path, copy_base(tmp_path), fake_command(steps=2), trials=1, space=ONE_KNOB, timeout_s=25.0,
                  grace_s=1.0, instrument=False, prebuild_ops=("ShareMemCommBuilder",))
    notes = []
    tuner = Tuner(s, LogObjective(warmup=1), env=clean_env(TORCH_EXTENSIONS_DIR=str(ext), CXX=str(stall)),
                  events=lambda kind, p: notes.append(p) if kind == "note" else None)
    with pytest.raises(X.PrebuildError) as err:
        tuner.prepare()
    assert "building DeepSpeed op ShareMemCommBuilder before the first trial failed (not built within 25 s)" \
        in str(err.value)
    assert X.find_locks([ext]) == [] and any("after the failed build" in n for n in notes), notes
